"""The objective of an OpenRLHF run: loaded, checked against what OpenRLHF can give, and carried to workers.

OpenRLHF builds its ``PolicyLoss`` inside each Ray actor, with its own keyword arguments only.
The launcher validates the objective in the driver, then hands the *resolved* objective (its
YAML, ``Objective.to_yaml()``) to every worker in the environment variable
``RLSTAB_OPENRLHF_OBJECTIVE``; workers rebuild it from that text, so a YAML file named on the
command line need not exist on the other nodes. The step-statistics mode travels the same way
(``RLSTAB_OPENRLHF_STEP_STATISTICS``).

The checks read the objective and its plan, never its compiled loss: the launcher validates an
objective without importing torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlstab.adapters import trainers
from rlstab.compiler.plan import Plan
from rlstab.errors import ConfigError
from rlstab.loading import load, parse_yaml
from rlstab.objective import Objective
from rlstab.presets import closest_presets, preset_names

OBJECTIVE_ENV = "RLSTAB_OPENRLHF_OBJECTIVE"
"""Environment variable holding the objective's YAML in every process of the run."""

STEP_STATISTICS_ENV = "RLSTAB_OPENRLHF_STEP_STATISTICS"
"""Environment variable holding where step statistics come from (``optimizer_step`` or ``local``) in every process."""

STEP_STATISTICS = trainers.OPENRLHF.step_statistics
"""``optimizer_step`` (default): over every micro-batch of the optimizer step and every data-parallel rank;
``local``: each micro-batch is its own step (the adapter's behaviour before step-wide statistics)."""


def build_objective(objective: Any, overrides: Any = None, label: str = "--objective") -> Objective:
    """Load ``objective`` (preset, YAML path, dict or Objective) with ``overrides`` merged over it, and check it.

    Errors are [`ConfigError`][rlstab.ConfigError]s that name ``label`` (the flag or variable
    the objective came from), the YAML path and the value.
    """
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(label, [f"overrides = {overrides!r}: must be a mapping of objective fields"])
    if objective is None and not overrides:
        raise ConfigError(label, ["required: a preset name (rlstab presets) or an objective YAML path"])
    if isinstance(objective, str) and not _names_a_preset_or_file(objective):
        raise ConfigError(label, [f"{objective!r}: neither a preset ({closest_presets(objective)}) nor a .yaml file"])
    source = objective
    if overrides:
        if objective is not None and not isinstance(objective, str):
            raise TypeError("overrides apply to a preset name or a YAML path; merge them into a dict objective yourself")
        source = dict(overrides) if objective is None else {"extends": objective, **overrides}
    try:
        loaded = load(source)
    except ConfigError as err:
        where = label if err.source in ("<dict>", "<yaml text>") else f"{label} -> {err.source}"
        raise ConfigError(where, err.problems) from None
    check_supported(loaded, label)
    return loaded


def _names_a_preset_or_file(text: str) -> bool:
    """A preset name or a .yaml/.yml path (YAML text, with newlines, is passed on to the loader)."""
    return text in preset_names() or text.endswith((".yaml", ".yml")) or "\n" in text


def check_supported(objective: Objective, label: str = "--objective") -> None:
    """Refuse components that OpenRLHF's loss call cannot feed, with the OpenRLHF flag to use instead.

    The lines are [`trainers.problems`][rlstab.adapters.trainers.problems]'s, as ``rlstab validate --trainer openrlhf`` prints them.
    """
    problems = trainers.problems(objective, "openrlhf")
    if problems:
        raise ConfigError(label, problems)


CORRECTION_FLAG = trainers.OPENRLHF_CORRECTION
"""OpenRLHF's flag with which it records vLLM's log-probabilities (``token`` or ``seq``; ``off`` records none)."""
MODE_FLAG = "--algo.advantage.is_correction_mode"
THRESHOLD_FLAG = "--algo.advantage.is_correction_threshold"


def check_rollout_source(objective: Objective, is_correction_level: str, label: str) -> None:
    """Refuse, at start-up, an objective that reads vLLM's log-probabilities when OpenRLHF records none.

    OpenRLHF passes ``rollout_log_probs`` to its loss only with ``is_correction_level`` ``token``
    or ``seq``; without this check the run would stop at its first micro-batch.
    """
    readers = list(dict.fromkeys(Plan.of(objective).readers("rollout_logprobs")))
    if readers and is_correction_level == "off":
        setting, why = trainers.OPENRLHF.on_setting["rollout_logprobs"]
        raise ConfigError(label, [
            f"{', '.join(readers)} {'reads' if len(readers) == 1 else 'read'} TokenBatch.rollout_logprobs: {why}; "
            f"{CORRECTION_FLAG} is off"
        ])


def double_correction(objective: Objective, level: str, mode: str, threshold) -> str | None:
    """The start-up warning when OpenRLHF's own importance-sampling coefficient would multiply the objective's correction.

    With ``is_correction_level`` on, OpenRLHF multiplies each token's loss by its coefficient
    (the adapter applies it as OpenRLHF does); an objective whose masks or reweighters correct for
    the rollout themselves would then correct twice, unless the coefficient is 1 (mode ``clip``,
    threshold ``1 1``). The text is [`trainers.openrlhf_double_correction`][rlstab.adapters.trainers.openrlhf_double_correction]'s,
    as ``rlstab validate --trainer openrlhf`` prints it. None when nothing is corrected twice.
    """
    readers = dict.fromkeys(Plan.of(objective).readers("rollout_logprobs"))
    correctors = [who for who in readers if who.startswith(trainers.CORRECTORS)]
    try:
        low, high = (0.0, *map(float, threshold)) if len(threshold) == 1 else map(float, threshold)  # one: the upper bound
    except (TypeError, ValueError):  # not OpenRLHF's two numbers: OpenRLHF's own parser says so
        return None
    if level == "off" or not correctors or (mode == "clip" and (low, high) == (1.0, 1.0)):
        return None
    fix = ([] if level == "token" else [f"{CORRECTION_FLAG} token"]) + list(trainers.OPENRLHF_NEUTRAL)  # clip: token only
    return (f"{CORRECTION_FLAG} {level} with {MODE_FLAG} {mode} and {THRESHOLD_FLAG} {low:g} {high:g}: "
            f"{trainers.openrlhf_double_correction(correctors)}; set {' '.join(fix)}")


def correction_level(argv: list[str]) -> str:
    """The value of ``--algo.advantage.is_correction_level`` among OpenRLHF's arguments; OpenRLHF's default ``off``."""
    return _flag_values(argv, CORRECTION_FLAG, ["off"])[0]


def correction_settings(argv: list[str]) -> tuple[str, str, list[str]]:
    """``(level, mode, threshold)`` of the correction among OpenRLHF's arguments, OpenRLHF's defaults where absent."""
    return (correction_level(argv), _flag_values(argv, MODE_FLAG, ["mask"])[0],
            _flag_values(argv, THRESHOLD_FLAG, ["0.5", "5.0"], several=True))


def _flag_values(argv: list[str], flag: str, default: list[str], several: bool = False) -> list[str]:
    """The last value(s) given to ``flag`` (``--flag v``, ``--flag=v``; with ``several``, up to the next ``--`` argument)."""
    values = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            end = i + 2
            while several and end < len(argv) and not argv[end].startswith("--"):
                end += 1
            values = argv[i + 1:end]
        elif arg.startswith(f"{flag}="):
            values = [arg.split("=", 1)[1]]
    return values


def objective_to_env(objective: Objective) -> str:
    """The text stored in ``RLSTAB_OPENRLHF_OBJECTIVE``: the resolved objective's YAML."""
    return objective.to_yaml()


def objective_from_env(environ: Mapping[str, str] | None = None) -> Objective:
    """The objective the launcher put in ``RLSTAB_OPENRLHF_OBJECTIVE``; a clear error when it is absent."""
    environ = os.environ if environ is None else environ
    text = environ.get(OBJECTIVE_ENV)
    if not text:
        raise ValueError(
            f"RlstabPolicyLoss was built without an objective and ${OBJECTIVE_ENV} is not set: start the run with "
            "`python -m rlstab.adapters.openrlhf --objective <preset or YAML> ...`, or pass objective= explicitly"
        )
    data = parse_yaml(text, f"${OBJECTIVE_ENV}")
    return build_objective(data, label=f"${OBJECTIVE_ENV}")


def check_step_statistics(value: str, label: str) -> str:
    """``value`` if it is one of [`STEP_STATISTICS`][rlstab.adapters.openrlhf.config.STEP_STATISTICS]; else a ConfigError naming ``label``."""
    if value not in STEP_STATISTICS:
        raise ConfigError(label, [f"{value!r}: must be one of {', '.join(STEP_STATISTICS)}"])
    return value


def step_statistics_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The mode the launcher put in ``RLSTAB_OPENRLHF_STEP_STATISTICS``; ``optimizer_step`` when it is unset."""
    environ = os.environ if environ is None else environ
    return check_step_statistics(environ.get(STEP_STATISTICS_ENV) or "optimizer_step", f"${STEP_STATISTICS_ENV}")
