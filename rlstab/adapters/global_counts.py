"""A trainer's global counts as a step's denominators, for adapters whose trainer counts the step itself.

veRL and OpenRLHF all-reduce the step's valid-token and response counts before the first
micro-batch and hand them to the loss; TRL counts its generation batch. Masks are known per
micro-batch, or per optimizer step once the adapter has gathered the step. So valid counts come
from the trainer (exact over the step) and kept counts are the trainer's count times the kept share
of the gathered statistics (exact over a gathered step; per micro-batch, exact when the share is
the same across micro-batches).

Rejections. A mask whose rejected tokens become padding (``acts_on_valid``: rollout rejection with
``rejected: padding``) removes them from the gathered valid counts too, while the trainer's counts,
made from its response mask, still hold them. For such an objective the valid counts are also the
trainer's count times a share: the gathered valid count over what the trainer counts in the
gathered scope ([`Counted`][rlstab.adapters.global_counts.Counted], from
[`response_counts`][rlstab.adapters.global_counts.response_counts]). Without this the step would
divide by tokens that no longer count, and a token-mean loss would shrink by the rejected share
(``tests/adapters/verl/test_rejection.py`` compares two veRL ranks with the whole step at once).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rlstab.aggregation import StepCounts
from rlstab.comm import Comm
from rlstab.lazy import torch

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats


@dataclass(frozen=True)
class Counted:
    """What the trainer's counts count, over the micro-batches and ranks a step's statistics were gathered on.

    Attributes:
        tokens: response-mask tokens (what the trainer's token count counts).
        sequences: responses as the trainer counts them: those with a response token (veRL,
            OpenRLHF), or every row (TRL).
        rejects: whether the objective turns rejected tokens into padding, so that the gathered
            valid counts are smaller than these and the trainer's valid counts are scaled too.
    """

    tokens: float
    sequences: float
    rejects: bool


def number(value) -> float | None:
    """A trainer's count (int, float or 0-d tensor) as a float; None stays None."""
    if value is None:
        return None
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def rejects(compiled: CompiledObjective) -> bool:
    """Whether a mask of the objective turns its rejected tokens into padding (``acts_on_valid``)."""
    return bool(compiled.plan.rejections)


def response_counts(batches: list[TokenBatch], *, group=None, distributed: bool | None = None) -> tuple[float, float]:
    """Response-mask tokens and responses with at least one, over ``batches`` on every rank of ``group`` (collective)."""
    device = batches[0].response_mask.device if batches else torch.device("cpu")
    local = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches:
        rows = batch.response_mask.to(torch.float64).sum(-1)
        local = local + torch.stack([rows.sum(), (rows > 0).to(torch.float64).sum()])
    tokens, sequences = Comm(group, distributed).sum(local).tolist()
    return tokens, sequences


def counted(
    compiled: CompiledObjective, batches: list[TokenBatch], *, group=None, distributed: bool | None = None
) -> Counted | None:
    """What veRL's and OpenRLHF's counts count over ``batches`` on every rank, when the objective rejects into padding.

    None (and no communication) when it does not: the gathered valid counts are then what the
    trainer counts. Every rank calls it where it gathers, with the same ``group``.
    """
    if not rejects(compiled):
        return None
    tokens, sequences = response_counts(batches, group=group, distributed=distributed)
    return Counted(tokens=tokens, sequences=sequences, rejects=True)


def with_global_counts(
    stats: StepStats,
    *,
    tokens: float | None,
    sequences: float | None,
    max_length: int,
    world_size: int,
    counted: Counted | None = None,
) -> StepStats:
    """``stats`` with the trainer's global ``tokens`` / ``sequences`` as denominators (None: the gathered ones).

    ``counted``: what the trainer's counts count over the gathered scope; None: the gathered valid
    counts (no rejections).
    """
    local = stats.counts
    if counted is None:
        counted = Counted(tokens=local.tokens_valid, sequences=local.sequences_valid, rejects=False)
    tokens_valid, tokens_kept = _mapped(tokens, local.tokens_valid, local.tokens_kept, counted.tokens, counted.rejects)
    sequences_valid, sequences_kept = _mapped(
        sequences, local.sequences_valid, local.sequences_kept, counted.sequences, counted.rejects
    )
    counts = StepCounts(
        tokens_valid=tokens_valid,
        tokens_kept=tokens_kept,
        sequences_valid=sequences_valid,
        sequences_kept=sequences_kept,
        max_length=max_length,
        world_size=world_size,
    )
    return replace(stats, counts=counts)


def _mapped(total: float | None, valid: float, kept: float, whole: float, rejects: bool) -> tuple[float, float]:
    """The valid and kept counts for a trainer's ``total``, which counts what ``whole`` counts in the gathered scope."""
    if total is None:
        return valid, kept
    return (_share(total, valid, whole) if rejects else total), _share(total, kept, whole)


def _share(total: float, part: float, whole: float) -> float:
    return total * part / whole if whole > 0 else 0.0
