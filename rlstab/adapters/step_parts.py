"""Stateful components in an adapter mode that computes the loss one micro-batch at a time.

TRL's ``data_parallel``, veRL's ``data_parallel`` and ``local`` and OpenRLHF's ``local`` see an optimizer
step's micro-batches one after the other and never the whole step first. A stateful component whose
step value comes from its state alone (adaptive entropy: the coefficient and gate of the last
measurement) is exact there: each micro-batch is gathered with ``part_of_step=True``, the measure
adds up over the step's micro-batches (and ranks, where the mode gathers over them), and the state
moves once ([`gather`][rlstab.CompiledObjective.gather]). One whose value reads the step's own
totals (BAPO's bounds, STARE's gate) would move from the first micro-batch alone, and one that
moves once per training batch where the mode never marks one, once per optimizer step: such a mode
refuses them at start-up where a step can have more than one micro-batch, naming the mode to use.
"""

from __future__ import annotations

from rlstab.compiler.plan import Plan


def whole_step_problem(objective, where: str, use: str, *, training_batch: bool = False) -> str | None:
    """The one-line refusal of ``objective``'s components that need the whole step, or None when it has none.

    ``where``: the mode as the user set it (``RlstabGRPOTrainer(step_statistics='data_parallel')``);
    ``use``: the setting to use instead. ``training_batch``: the mode never marks a training batch
    either, so a component that moves once per training batch is refused too (it would move once
    per optimizer step).
    """
    plan = Plan.of(objective)
    labels = list(plan.whole_step)
    if training_batch:
        labels += [label for label in plan.training_batch if label not in labels]
    if not labels:
        return None
    scope = "optimizer step or training batch" if training_batch and plan.training_batch else "optimizer step"
    return (
        f"{where}: {', '.join(labels)} {'needs' if len(labels) == 1 else 'need'} the whole {scope} before its first "
        f"micro-batch, but this mode sees one micro-batch at a time; use {use}"
    )
