"""TRL's loss normalisers as rlstab's step denominators ([`StepCounts`][rlstab.aggregation.StepCounts]).

TRL computes the loss one micro-batch at a time, sums the gradients of an optimizer step's
``GA = current_gradient_accumulation_steps`` micro-batches, and DDP averages them over the
``P = accelerator.num_processes`` processes. Its built-in losses scale each micro-batch so that
this sum is the step's loss (``GRPOTrainer.loss_is_scaled_for_ga = True``):

| TRL ``loss_type`` | micro-batch loss | rlstab aggregation | StepCounts |
|---|---|---|---|
| ``dapo`` (also cispo, vespo) | ``sum l / (N * GA / spg / P)`` | ``token-mean`` | ``tokens_valid = N * GA / spg`` |
| ``grpo`` (also sapo) | ``mean_i (sum_t l / n_i) / GA`` | ``seq-mean-token-mean`` | ``sequences_valid = B * GA * P`` |
| ``dr_grpo`` | ``sum l / (B * L) / GA`` | ``seq-mean-token-sum-norm`` | ``sequences_valid = B * GA * P``, ``max_length = L`` |
| ``luspo`` | ``mean_i (sum_t l) / GA`` | ``seq-mean-token-sum`` | ``sequences_valid = B * GA * P`` |

with ``N = num_items_in_batch`` (TRL's count of loss-mask tokens of the whole generation batch,
all processes), ``spg = steps_per_generation``, ``B`` the micro-batch's completions and
``L = max_completion_length``; and ``world_size = P`` everywhere, because rlstab multiplies by the
world size to undo DDP's average. Each rlstab aggregation then gives exactly the scaling of the
TRL loss type beside it. In evaluation TRL neither accumulates nor splits the batch: ``GA = 1``
and ``N`` is used as is.

``N * GA / spg`` is the accumulation window's exact token count when ``steps_per_generation ==
gradient_accumulation_steps`` (TRL's default); otherwise it is TRL's own average per window, kept
so that the ``token-mean`` loss stays TRL's ``dapo`` loss.

``B * GA * P`` counts every completion, also one that ``mask_truncated_completions`` emptied, as
TRL's per-micro-batch ``.mean()`` does (rlstab on its own counts responses with at least one token).

These are the trainer's counts of [`with_global_counts`][rlstab.adapters.global_counts.with_global_counts],
as veRL's and OpenRLHF's are: what they count over a gathered scope is its loss-mask tokens and
every row ([`Counted`][rlstab.adapters.global_counts.Counted]). A mask whose rejected tokens become
padding (rollout rejection with ``rejected: padding``) shrinks the valid counts by the gathered
share, as in the other adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlstab.adapters.global_counts import Counted, rejects, response_counts, with_global_counts

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats


@dataclass(frozen=True)
class TrlScale:
    """What TRL knows about the optimizer step when a micro-batch's loss runs.

    Attributes:
        tokens: loss-mask tokens of the accumulation window over all processes (TRL's ``dapo`` normaliser times P).
        sequences: completions of the window over all processes, ``B * GA * P``.
        max_length: ``max_completion_length`` (the ``dr_grpo`` constant).
        world_size: ``P``, the number of processes whose gradients DDP averages.
        accumulation: ``GA``, micro-batches in this optimizer step (1 in evaluation).
    """

    tokens: float
    sequences: float
    max_length: int
    world_size: int
    accumulation: int


def trl_scale(
    *,
    num_items_in_batch: float,
    micro_batch_size: int,
    padded_length: int,
    num_processes: int,
    accumulation_steps: int,
    steps_per_generation: int,
    max_completion_length: int | None,
    training: bool,
) -> TrlScale:
    """TRL's normalisers for one micro-batch (arguments as ``GRPOTrainer`` holds them)."""
    ga = accumulation_steps if training else 1
    tokens = float(num_items_in_batch)
    if training:
        tokens = tokens * ga / steps_per_generation
    return TrlScale(
        tokens=tokens,
        sequences=float(micro_batch_size * ga * num_processes),
        max_length=int(max_completion_length or padded_length),
        world_size=int(num_processes),
        accumulation=int(ga),
    )


def step_stats(
    compiled: CompiledObjective,
    batch: TokenBatch,
    scale: TrlScale,
    *,
    distributed: bool | None = None,
    update_state: bool = True,
    part_of_step: bool = False,
) -> StepStats:
    """The step statistics of one TRL micro-batch: TRL's denominators, this micro-batch's thresholds.

    Exact over the optimizer step (every micro-batch, every process): the valid-token count
    (``tokens_valid``), the number of completions, ``max_completion_length`` and the process count,
    because TRL knows them before the first micro-batch. Per micro-batch, gathered over every
    process (``torch.distributed``, as TRL's ``top_entropy_quantile`` does): mask thresholds
    (entropy quantiles), because the current policy's entropy of the other micro-batches does not
    exist before their forward; and the kept share, so ``count: kept`` divides by
    ``tokens_valid * (kept / valid of this micro-batch)`` and by this micro-batch's responses
    with a kept token times ``GA``. A mask whose rejected tokens become padding (rollout
    rejection with ``rejected: padding``) shrinks ``tokens_valid`` and ``sequences_valid`` by this
    micro-batch's share in the same way.

    ``update_state``: a new optimizer step begins (the trainer passes True on its first micro-batch
    only); ``part_of_step``: the micro-batch is one part of the step, so a controller whose value
    comes from its state (adaptive entropy) measures every micro-batch and moves once
    ([`step_parts`][rlstab.adapters.step_parts]).
    """
    local = compiled.gather([batch], distributed=distributed, update_state=update_state, part_of_step=part_of_step)
    return with_trainer_counts(local, scale, counted(compiled, [batch], local, scale, distributed=distributed))


def counted(
    compiled: CompiledObjective,
    batches: list[TokenBatch],
    stats: StepStats,
    scale: TrlScale,
    *,
    distributed: bool | None = None,
) -> Counted:
    """What TRL's counts count over ``batches`` of this process and the same micro-batches of every process.

    Every row (``B * P`` per micro-batch), and the loss-mask tokens: the gathered valid count of
    ``stats``, or, when the objective rejects tokens into padding (which leaves them out of it),
    the loss mask summed over ``batches`` and processes.
    """
    rows = float(sum(b.shape[0] for b in batches) * scale.world_size)
    if not rejects(compiled):
        return Counted(tokens=stats.counts.tokens_valid, sequences=rows, rejects=False)
    tokens, _ = response_counts(batches, distributed=distributed)
    return Counted(tokens=tokens, sequences=rows, rejects=True)


def with_trainer_counts(stats: StepStats, scale: TrlScale, scope: Counted, *, tokens: bool = True) -> StepStats:
    """``stats`` with TRL's counts as the denominators (``scope``: what they count over the gathered micro-batches).

    ``tokens=False`` keeps the gathered token counts: over a whole gathered optimizer step they are exact.
    """
    return with_global_counts(
        stats,
        tokens=scale.tokens if tokens else None,
        sequences=scale.sequences,
        max_length=scale.max_length,
        world_size=scale.world_size,
        counted=scope,
    )
