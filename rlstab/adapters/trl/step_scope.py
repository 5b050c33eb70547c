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

from rlstab.adapters.trl.counts import TrlScale, counted, with_trainer_counts
from rlstab.compiled import StepStats


def window_stats(trainer, model, scale: TrlScale) -> StepStats:
    """Statistics of the optimizer step that starts at ``trainer._step``, over all its micro-batches and processes.

    Token counts (valid and kept), kept responses and thresholds are exact over the step.
    ``sequences_valid`` stays TRL's ``B * GA * P`` (every completion; with a mask that rejects
    into padding, the completions it leaves a token), and ``max_length`` and ``world_size`` are
    TRL's, as in the per-micro-batch mode.
    """
    inputs = window_inputs(trainer, scale.accumulation)
    batches = [trainer._rlstab_probe(model, micro_batch) for micro_batch in inputs]
    compiled = trainer.rlstab_compiled
    stats = compiled.gather(batches, update_state=True)  # once per optimizer step
    return with_trainer_counts(stats, scale, counted(compiled, batches, stats, scale), tokens=False)


def window_inputs(trainer, accumulation: int) -> list[dict]:
    """The buffered TRL micro-batches of the optimizer step that starts at ``trainer._step``."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    start = trainer._step
    for j in range(1, accumulation):
        if (start + j) % generate_every == 0:
            raise RuntimeError(
                "RlstabGRPOTrainer(step_statistics='optimizer_step'): this optimizer step's micro-batches come "
                f"from two generation batches (micro-batch {start + j} starts a new one); make "
                f"steps_per_generation ({trainer.args.steps_per_generation}) a multiple of gradient_accumulation_steps "
                f"({trainer.args.gradient_accumulation_steps}) and the number of micro-batches per epoch a multiple of it too"
            )
    spg = trainer.args.steps_per_generation
    return [trainer._buffered_inputs[(start + j) % spg] for j in range(accumulation)]
