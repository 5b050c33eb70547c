"""One run of the lab: an objective trained under a regime from a seed, checkpointed and resumable.

The training is the embedded trainer's ``rlstab.trainer.run.Run`` (policy lag included). Around it,
the lab adds what a long grid needs:

- **checkpoints** every ``checkpoint_every`` steps, atomically: the run's ``state_dict()`` and every
  metrics row so far. A rerun resumes from the last one and ends with the same rows as a run never
  interrupted (the per-step ``time`` is the only field that differs: it is measured, not computed).
  With ``keep_checkpoints`` each one is also kept as ``checkpoints/stepNNNNNN.pt``, the last step's
  included, after the run finishes: the saved states ``rlstab audit --counterfactual`` starts from;
- each row adds the step's ``ess_fraction`` and ``time`` to the trainer's row;
- one torch thread per run, so its numbers do not depend on how many runs share the machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rlstab.lab.checkpoint import (
    SUMMARY_FILE,
    append_row,
    keep_checkpoint,
    load_checkpoint,
    read_rows,
    save_checkpoint,
    write_json,
    write_rows,
)
from rlstab.lab.spec import RunSpec, write_spec
from rlstab.lab.summary import run_summary
from rlstab.lazy import torch
from rlstab.loading import load
from rlstab.trainer.config import TrainConfig

CHECKPOINT_EVERY = 10


def train_config(spec: RunSpec) -> TrainConfig:
    """The trainer's config of ``spec``: its regime's settings, its steps and its seed."""
    return spec.regime.train_config(steps=spec.steps, seed=spec.seed)


def execute(
    spec: RunSpec,
    folder: Path | str,
    *,
    cache_dir: Path | str | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
    on_step: Callable[[int], None] | None = None,
    keep_checkpoints: bool = False,
) -> dict:
    """Run (or finish, or just read) ``spec``'s run in ``folder``; returns ``{"summary", "rows"}``.

    A finished run (``summary.json`` present) is read, not retrained; an interrupted one resumes from
    its checkpoint. The caller checks ``folder``'s ``spec.json`` against ``spec`` first
    (``rlstab.lab.spec.mismatch``).
    """
    folder = Path(folder)
    if (folder / SUMMARY_FILE).exists():
        return {"summary": json.loads((folder / SUMMARY_FILE).read_text()), "rows": read_rows(folder)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(spec, folder, cache_dir, checkpoint_every, on_step, keep_checkpoints)
    finally:
        torch.set_num_threads(threads)


def _train(spec: RunSpec, folder: Path, cache_dir, checkpoint_every: int, on_step,
           keep_checkpoints: bool = False) -> dict:
    from rlstab.trainer.run import Run

    write_spec(spec, folder)
    run = Run(load(spec.objective), train_config(spec), spec.task, label=spec.label, model=spec.model,
              cache_dir=cache_dir)
    saved = load_checkpoint(folder)
    if saved is None:
        rows = [run.start()]
    else:
        rows = saved.pop("rows")
        run.load_state_dict(saved)
    write_rows(folder, rows)  # on resume: drop rows a killed run wrote after its last checkpoint

    while not run.done:
        outcome = run.step()
        row = {**outcome.row, "ess_fraction": outcome.ess_fraction, "time": outcome.seconds}
        rows.append(row)
        append_row(folder, row)
        step = run.steps_done
        if step % checkpoint_every == 0 and (keep_checkpoints or not run.done):
            state = {**run.state_dict(), "rows": rows}
            if not run.done:
                save_checkpoint(folder, state)
            if keep_checkpoints:
                keep_checkpoint(folder, step, state)
        if on_step:
            on_step(step)

    summary = run_summary(rows)
    write_json(folder / SUMMARY_FILE, summary)
    (folder / "checkpoint.pt").unlink(missing_ok=True)
    return {"summary": summary, "rows": rows}
