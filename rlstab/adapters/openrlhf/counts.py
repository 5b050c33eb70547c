"""OpenRLHF's global counts as the step's denominators.

OpenRLHF's ``aggregate_loss`` divides a token mean by ``batch_num_tokens`` and a sequence mean by
``global_batch_size``: the step's valid tokens and non-empty responses over every micro-batch of
the optimizer step and every data-parallel rank, divided by the gradient-accumulation steps
(DeepSpeed scales each micro-batch loss by their inverse), and multiplies by ``dp_size``
(DeepSpeed averages gradients over ranks). ``training_step`` hands those counts to the loss; they
stay the denominators ([`with_global_counts`][rlstab.adapters.global_counts.with_global_counts]),
so the loss keeps OpenRLHF's normalisation, and the kept share comes from the gathered statistics.

Rejections: OpenRLHF counts from ``action_mask``, so a rollout rejection whose rejected tokens
become padding (vLLM's log-probs reach the loss with ``--algo.advantage.is_correction_level``)
shares the valid counts too ([`Counted`][rlstab.adapters.global_counts.Counted]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.adapters.global_counts import Counted, counted, number, with_global_counts
from rlstab.aggregation import TokenMean

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats


def step_stats(
    compiled: CompiledObjective,
    batch: TokenBatch,
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    update_state: bool = True,
) -> StepStats:
    """The step statistics of one OpenRLHF micro-batch, with OpenRLHF's global counts (``step_statistics='local'``).

    When the count the objective's aggregation divides by is None, OpenRLHF takes the
    micro-batch's own mean without ``dp_size``, and so does this (the micro-batch is its own step).
    The micro-batch is one part of the optimizer step ([`step_parts`][rlstab.adapters.step_parts]);
    ``update_state``: it is the step's first.

    Exact over the step: those counts and ``dp_size``. Per micro-batch, because OpenRLHF runs
    forward, loss and backward one micro-batch at a time and the current policy's entropy does
    not exist before its forward: mask thresholds (entropy quantiles), the kept share
    (``count: kept`` divides by the global count times this micro-batch's kept fraction), and
    ``seq-mean-token-sum-norm``'s ``max_length`` (this micro-batch's padded length).
    """
    local = compiled.gather([batch], distributed=False, update_state=update_state, part_of_step=True)
    scope = counted(compiled, [batch], distributed=False)
    return with_trainer_counts(compiled, local, dp_size, batch_num_tokens, global_batch_size, scope)


def with_trainer_counts(
    compiled: CompiledObjective,
    stats: StepStats,
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    scope: Counted | None = None,
) -> StepStats:
    """``stats`` with OpenRLHF's global counts as the denominators, so the loss keeps OpenRLHF's normalisation.

    The valid counts are OpenRLHF's (``batch_num_tokens``, ``global_batch_size``, ``dp_size``); the
    kept counts are those times the kept share of ``stats``: the micro-batch's own share for a
    micro-batch's statistics, the whole step's (every micro-batch and rank) for step-wide ones.
    ``scope``: what OpenRLHF's counts count over the micro-batches and ranks of ``stats``, for an
    objective that rejects tokens into padding. When the count the aggregation divides by is
    None, ``stats`` is returned as it is.
    """
    uses_tokens = isinstance(compiled.objective.aggregation, TokenMean)
    total = batch_num_tokens if uses_tokens else global_batch_size
    if total is None:
        return stats
    return with_global_counts(
        stats,
        tokens=number(batch_num_tokens),
        sequences=number(global_batch_size),
        max_length=stats.counts.max_length,
        world_size=int(dp_size),
        counted=scope,
    )
