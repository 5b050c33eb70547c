"""``AsyncGRPOTrainer``'s loss normalisers as rlstab's step denominators.

TRL's async loss for one micro-batch (``AsyncGRPOTrainer.compute_loss``) is

    sum_local l / (N / P) / GA

with ``N = global_n_tokens`` (the trained tokens of the micro-batch over all ``P`` ranks, which
the collator broadcasts) and ``GA = current_gradient_accumulation_steps``; DDP averages the
gradients over ranks and accumulation sums the ``GA`` micro-batches. So the step's loss is the
mean over its micro-batches of each micro-batch's token mean: every micro-batch weighs the same,
whatever its token count (TRL's comment there: "For DAPO, we would scale like this instead").
rlstab's ``token-mean`` gives exactly this with the trainer's counts ``tokens_valid = N * GA`` and
``world_size = P`` (rlstab multiplies by the world size to undo DDP's average), as the GRPO
adapter keeps ``GRPOTrainer``'s counts ([`counts`][rlstab.adapters.trl.counts]).

| rlstab aggregation | StepCounts in ``step_statistics="data_parallel"`` (TRL's counts) |
|---|---|
| ``token-mean`` | ``tokens_valid = N * GA``: TRL's own async loss |
| ``seq-mean-token-mean``, ``seq-mean-token-sum`` | ``sequences_valid = S * GA`` |
| ``seq-mean-token-sum-norm`` | as above, ``max_length = max_completion_length`` |

with ``S`` the micro-batch's samples over all ranks, ``global_n_forward_tokens / mean_seq_len``
as TRL counts them for ``batch/samples_per_step``. With ``step_statistics="optimizer_step"`` the
token counts are those gathered over the step's micro-batches and ranks (the step's token mean,
DAPO's) and ``sequences_valid`` is the step's samples over all ranks; the two modes agree when
the micro-batches hold the same number of tokens (one micro-batch per step: always).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlstab.adapters.global_counts import Counted, rejects, response_counts
from rlstab.adapters.trl.counts import TrlScale, with_trainer_counts

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats


def samples(inputs: dict[str, Any]) -> float:
    """The micro-batch's samples over every rank, from the counts its collator broadcasts (as TRL counts them)."""
    return float(round(float(inputs["global_n_forward_tokens"][0]) / float(inputs["mean_seq_len"][0])))


def async_scale(
    inputs: dict[str, Any], *, num_processes: int, accumulation: int, max_completion_length: int
) -> TrlScale:
    """TRL's normalisers for one async micro-batch: ``N * GA`` tokens and ``S * GA`` samples over ``P`` ranks."""
    return TrlScale(
        tokens=float(inputs["global_n_tokens"][0]) * accumulation,
        sequences=samples(inputs) * accumulation,
        max_length=int(max_completion_length),
        world_size=int(num_processes),
        accumulation=int(accumulation),
    )


def counted(
    compiled: CompiledObjective,
    batches: list[TokenBatch],
    stats: StepStats,
    rows: float,
    *,
    distributed: bool | None = None,
) -> Counted:
    """What the async trainer's counts count over ``batches`` and the same micro-batches of every rank.

    ``rows``: the samples of those micro-batches over every rank (``samples`` summed). Tokens: the
    gathered valid count, or, when the objective rejects tokens into padding (which leaves them
    out of it), the trained tokens summed over ``batches`` and ranks.
    """
    if not rejects(compiled):
        return Counted(tokens=stats.counts.tokens_valid, sequences=rows, rejects=False)
    tokens, _ = response_counts(batches, distributed=distributed)
    return Counted(tokens=tokens, sequences=rows, rejects=True)


def step_stats(
    compiled: CompiledObjective,
    batch: TokenBatch,
    inputs: dict[str, Any],
    scale: TrlScale,
    *,
    update_state: bool = True,
    distributed: bool | None = None,
) -> StepStats:
    """One micro-batch's statistics (thresholds gathered over the ranks' rows of it) with TRL's counts.

    The micro-batch is one part of the optimizer step ([`step_parts`][rlstab.adapters.step_parts]);
    ``update_state``: it is the step's first."""
    local = compiled.gather([batch], distributed=distributed, update_state=update_state, part_of_step=True)
    scope = counted(compiled, [batch], local, samples(inputs), distributed=distributed)
    return with_trainer_counts(local, scale, scope)
