"""Step statistics over a whole ``AsyncGRPOTrainer`` optimizer step (``step_statistics="optimizer_step"``).

The async trainer streams its micro-batches from the rollout queue, but transformers' training
loop (``Trainer._inner_training_loop``) fetches all ``GA`` micro-batches of an optimizer step at
once, through ``Trainer.get_batch_samples``, before the first one's loss runs. The adapter keeps
that list ([`Window`][rlstab.adapters.trl.async_step_scope.Window]): so, as with
``GRPOTrainer``'s buffered generation batch, every micro-batch of the step is known at its first
micro-batch, and only the current policy's log-probabilities and entropies are not. The weights
do not move within the step (gradients accumulate; the optimizer steps after the last
micro-batch), so one no-grad forward over the step's micro-batches gives the values their own
forwards will produce. From those, rlstab's [`gather`][rlstab.CompiledObjective.gather] computes
the mask thresholds and the kept-token and kept-sample counts over the whole step and every rank
(``torch.distributed``; each rank holds its own row of each micro-batch), and freezes them for
the step's micro-batches.

Caveats, as for ``GRPOTrainer``: the extra forward costs about one forward of the step; a model
with dropout active draws different masks in the probe and in the training forward; a token that
sits exactly on a threshold can move with floating-point differences between the two forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlstab.adapters.trl.async_counts import counted, samples
from rlstab.adapters.trl.counts import TrlScale, with_trainer_counts
from rlstab.compiled import StepStats


@dataclass(frozen=True)
class Window:
    """The micro-batches of one optimizer step, as ``get_batch_samples`` returned them.

    Attributes:
        step: ``state.global_step`` when they were fetched (the step they train).
        inputs: this rank's micro-batch dicts, in training order.
    """

    step: int
    inputs: list[dict[str, Any]]


def window_stats(trainer, model, window: Window, scale: TrlScale) -> StepStats:
    """Statistics of the optimizer step ``window`` over all its micro-batches and ranks.

    Token counts (valid and kept), kept samples and thresholds are exact over the step; the
    valid samples are the step's samples over every rank (the collators' counts), and
    ``max_length`` and ``world_size`` are TRL's.
    """
    batches = [trainer._rlstab_probe(model, trainer._prepare_inputs(inputs)) for inputs in window.inputs]
    compiled = trainer.rlstab_compiled
    stats = compiled.gather(batches, update_state=True)  # once per optimizer step
    rows = sum(samples(inputs) for inputs in window.inputs)
    step_scale = TrlScale(
        tokens=scale.tokens, sequences=rows, max_length=scale.max_length,
        world_size=scale.world_size, accumulation=scale.accumulation,
    )
    return with_trainer_counts(stats, step_scale, counted(compiled, batches, stats, rows), tokens=False)
