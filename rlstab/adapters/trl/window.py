"""Step statistics over a whole optimizer step (``step_statistics="optimizer_step"``).

TRL generates a whole generation batch, splits it into micro-batches and buffers them
(``GRPOTrainer._buffered_inputs``) before the first micro-batch's loss runs. So, unlike in veRL
or OpenRLHF, every micro-batch of an optimizer step is known when its first micro-batch starts;
only the current policy's entropies and log-probabilities are not, because they need a forward
pass. The policy does not change within an optimizer step (gradients accumulate, the optimizer
steps after the last micro-batch), so one no-grad forward over the step's micro-batches gives
exactly the values each micro-batch's own forward will produce. From those, rlstab's
[`gather`][rlstab.CompiledObjective.gather] computes the mask thresholds (entropy quantiles) and
the kept-token and kept-response counts over the whole step and every process
(``torch.distributed``), and freezes them for the step's micro-batches.

Caveats: the extra forward pass costs about what the log-probability pass of the old policy
costs; a model with dropout active draws different masks in the probe and in the training
forward (TRL's ``disable_dropout=True`` removes that); and floating-point differences between a
no-grad and a grad forward can move a token that sits exactly on a threshold.
"""

from __future__ import annotations

from dataclasses import replace

from rlstab.adapters.trl.counts import TrlScale
from rlstab.aggregation import StepCounts
from rlstab.compiled import StepStats


def window_stats(trainer, model, scale: TrlScale) -> StepStats:
    """Statistics of the optimizer step that starts at ``trainer._step``, over all its micro-batches and processes.

    Token counts (valid and kept), kept responses and thresholds are exact over the step.
    ``sequences_valid`` stays TRL's ``B * GA * P`` (every completion), and ``max_length`` and
    ``world_size`` are TRL's, as in the per-micro-batch mode.
    """
    inputs = trainer._rlstab_window_inputs(scale.accumulation)
    batches = [trainer._rlstab_probe(model, micro_batch) for micro_batch in inputs]
    stats = trainer.rlstab_compiled.gather(batches, update_state=True)  # once per optimizer step
    c = stats.counts
    counts = StepCounts(
        tokens_valid=c.tokens_valid,
        tokens_kept=c.tokens_kept,
        sequences_valid=scale.sequences,
        sequences_kept=c.sequences_kept,
        max_length=scale.max_length,
        world_size=scale.world_size,
    )
    return replace(stats, counts=counts)
