"""veRL's global counts as the step's denominators.

verl's ``ppo_loss`` all-reduces the step's counts before the first micro-batch and hands them to
the policy loss in ``config.global_batch_info``: the valid-token count (``batch_num_tokens``), the
number of responses (``global_batch_size``), ``dp_size`` and ``loss_scale_factor``. They stay the
denominators ([`with_global_counts`][rlstab.adapters.global_counts.with_global_counts]), so the loss
keeps verl's normalisation; the kept share comes from the gathered statistics.

Rejections: verl's own rollout rejection (``algorithm.rollout_correction``) edits
``response_mask`` in the driver, so its counts already leave rejected tokens out. rlstab's
rejection masks read ``rollout_logprobs``, which verl's loss is not given (the config refuses
them); should a batch carry them, the counts are shared over the response-mask tokens as in the
other adapters ([`Counted`][rlstab.adapters.global_counts.Counted]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.adapters.global_counts import Counted, counted, number, with_global_counts

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats


def is_global(info: dict) -> bool:
    """Whether verl gave step-wide denominators (otherwise the micro-batch is its own step, as in verl)."""
    return (info.get("dp_size") or 1) > 1 or any(
        info.get(k) is not None for k in ("batch_num_tokens", "global_batch_size", "loss_scale_factor")
    )


def step_stats(
    compiled: CompiledObjective,
    batch: TokenBatch,
    info: dict,
    across_ranks: bool = False,
    group=None,
    update_state: bool = True,
) -> StepStats:
    """The step statistics of one verl micro-batch, with verl's global denominators.

    Exact over the step (every micro-batch of the mini-batch, every data-parallel rank), because
    verl all-reduces them before the first micro-batch: the valid-token count
    (``batch_num_tokens``), the number of responses (``global_batch_size``), ``dp_size`` and
    ``loss_scale_factor``. Per micro-batch, because verl runs forward, loss and backward one
    micro-batch at a time and the current policy's entropy does not exist before its forward:
    mask thresholds (entropy quantiles) and the share of kept tokens, so a ``count: kept``
    denominator is the global valid count times this micro-batch's kept fraction.
    ``across_ranks``: thresholds and kept fraction over this micro-batch on every rank of
    ``group`` (a collective call). Without global info (one rank, no ``batch_num_tokens``) the
    micro-batch is its own step, as in verl. The micro-batch is one part of the optimizer step
    ([`step_parts`][rlstab.adapters.step_parts]); ``update_state``: it is the step's first.
    """
    local = compiled.gather(
        [batch], group=group, distributed=across_ranks, update_state=update_state, part_of_step=True
    )
    scope = counted(compiled, [batch], group=group, distributed=across_ranks) if is_global(info) else None
    return with_trainer_counts(local, info, batch.shape[1], scope)


def with_trainer_counts(stats: StepStats, info: dict, padded_length: int, scope: Counted | None = None) -> StepStats:
    """``stats`` with verl's global counts (``info``, verl's ``global_batch_info``) as the denominators.

    ``padded_length``: the ``max_length`` of ``seq-mean-token-sum-norm`` when verl gives no
    ``loss_scale_factor`` (verl's own losses then take the micro-batch's padded length). ``scope``:
    what verl's counts count over the micro-batches and ranks ``stats`` were gathered on, for an
    objective that rejects tokens into padding ([`counted`][rlstab.adapters.global_counts.counted]).
    """
    if not is_global(info):
        return stats
    dp_size = int(info.get("dp_size") or 1)
    tokens = number(info.get("batch_num_tokens"))
    sequences = number(info.get("global_batch_size"))
    if dp_size > 1 and (tokens is None or sequences is None):
        raise ValueError(
            "dp_size > 1 needs the global batch_num_tokens and global_batch_size in config.global_batch_info "
            "(verl's ppo_loss sets them)"
        )
    scale_factor = info.get("loss_scale_factor")
    max_length = padded_length if scale_factor is None else int(scale_factor)
    return with_global_counts(
        stats, tokens=tokens, sequences=sequences, max_length=max_length, world_size=dp_size, counted=scope
    )
