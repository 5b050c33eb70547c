"""``python -m rlstab.adapters.openrlhf --objective <preset or YAML> <train_ppo_ray arguments>``.

1. Loads and checks the objective in the driver, before anything of OpenRLHF or Ray is
   imported: a bad YAML fails in seconds, naming the file, the YAML path and the value.
2. Stores the resolved objective in ``$RLSTAB_OPENRLHF_OBJECTIVE`` and the step-statistics mode
   (``--step-statistics optimizer_step|local``) in ``$RLSTAB_OPENRLHF_STEP_STATISTICS``, and installs the loss in the
   driver ([`install`][rlstab.adapters.openrlhf.hook.install]).
3. Runs OpenRLHF's own entry point, ``openrlhf.cli.train_ppo_ray``, as ``__main__`` with the
   remaining arguments, so OpenRLHF parses and validates them itself. That entry point starts
   Ray with ``ray.init(runtime_env={"env_vars": {...}})``; the launcher wraps ``ray.init`` so
   that this very call also carries the objective and the mode (``env_vars``) and rlstab's
   ``worker_process_setup_hook``, which installs the loss in every Ray worker (a patch made in
   the driver does not reach Ray actors). Whatever OpenRLHF puts in its ``runtime_env`` is kept
   as it is: nothing of it is copied into rlstab.
"""

from __future__ import annotations

import argparse
import functools
import os
import runpy
import sys
from collections.abc import Callable, Sequence

from rlstab.adapters.openrlhf.config import (
    OBJECTIVE_ENV,
    STEP_STATISTICS,
    STEP_STATISTICS_ENV,
    build_objective,
    check_rollout_source,
    correction_level,
    correction_settings,
    double_correction,
    objective_to_env,
)
from rlstab.adapters.openrlhf.hook import SETUP_HOOK
from rlstab.command_line import installed
from rlstab.errors import ConfigError
from rlstab.loading import parse_yaml

ENTRY_POINT = "openrlhf.cli.train_ppo_ray"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rlstab.adapters.openrlhf",
        description="Run OpenRLHF's train_ppo_ray with an rlstab objective as the policy loss. "
        "Every other argument is OpenRLHF's (python -m openrlhf.cli.train_ppo_ray --help).",
        add_help=False,
    )
    p.add_argument("--objective", required=True, help="a preset name (rlstab presets) or an objective YAML path")
    p.add_argument(
        "--objective-overrides",
        default=None,
        metavar="YAML",
        help="fields merged over the objective, as extends: would, e.g. '{surrogate: {eps_high: 0.3}}'",
    )
    p.add_argument(
        "--step-statistics",
        choices=STEP_STATISTICS,
        default="optimizer_step",
        help="optimizer_step (default): thresholds, kept counts and stateful components over the whole optimizer "
        "step on every data-parallel rank; local: each micro-batch is its own step",
    )
    p.add_argument("--rlstab-help", action="help", help="show this message and exit")
    return p


def runtime_env_with_rlstab(runtime_env: dict | None, objective_text: str, step_statistics: str | None = None) -> dict:
    """``runtime_env`` plus the objective and the step-statistics mode (``env_vars``) and rlstab's ``worker_process_setup_hook``."""
    env = dict(runtime_env or {})
    hook = env.get("worker_process_setup_hook")
    if hook not in (None, SETUP_HOOK):
        raise ValueError(
            f"runtime_env already has worker_process_setup_hook={hook!r}; rlstab needs its own ({SETUP_HOOK}). "
            "Call rlstab.adapters.openrlhf.install() from your hook instead"
        )
    env["worker_process_setup_hook"] = SETUP_HOOK
    env["env_vars"] = {**env.get("env_vars", {}), OBJECTIVE_ENV: objective_text}
    if step_statistics is not None:
        env["env_vars"][STEP_STATISTICS_ENV] = step_statistics
    return env


def with_rlstab_runtime_env(init: Callable, objective_text: str, step_statistics: str | None = None) -> Callable:
    """Wrap ``ray.init`` so that its ``runtime_env`` gains rlstab's entries."""

    @functools.wraps(init)
    def ray_init(*args, **kwargs):
        kwargs["runtime_env"] = runtime_env_with_rlstab(kwargs.get("runtime_env"), objective_text, step_statistics)
        return init(*args, **kwargs)

    return ray_init


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = parser().parse_known_args(argv)
    try:
        overrides = None
        if ours.objective_overrides is not None:
            overrides = parse_yaml(ours.objective_overrides, "--objective-overrides")
        objective = build_objective(ours.objective, overrides, label="--objective")
        check_rollout_source(objective, correction_level(rest), "--objective")
    except (ConfigError, TypeError) as err:
        print(f"rlstab: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if ours.step_statistics == "optimizer_step" and "--train.dynamic_batch_enable" in rest:
        print(
            "rlstab: --step-statistics optimizer_step (the default) does not support --train.dynamic_batch_enable; "
            "disable dynamic batching, or pass --step-statistics local (statistics per micro-batch)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    missing = [name for name in ("openrlhf", "ray") if not installed(name)]
    if missing:  # checked after the objective, so that a bad one is answered without the extra too
        print(f"rlstab: the OpenRLHF launcher needs {' and '.join(missing)}, not installed here: "
              "pip install 'rlstab[openrlhf]'", file=sys.stderr)
        raise SystemExit(2)
    twice = double_correction(objective, *correction_settings(rest))
    if twice is not None:  # a warning: OpenRLHF's correction on top may be what the user wants
        print(f"rlstab: warning: {twice}", file=sys.stderr)
    text = objective_to_env(objective)
    os.environ[OBJECTIVE_ENV] = text
    os.environ[STEP_STATISTICS_ENV] = ours.step_statistics
    print(f"rlstab: policy loss = objective {objective.name or ours.objective!r}, step statistics = "
          f"{ours.step_statistics}", file=sys.stderr)

    from rlstab.adapters.openrlhf.hook import install

    install()
    import ray

    original = ray.init
    ray.init = with_rlstab_runtime_env(original, text, ours.step_statistics)
    saved_argv = sys.argv
    sys.argv = [ENTRY_POINT, *rest]
    try:
        runpy.run_module(ENTRY_POINT, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved_argv
        ray.init = original
