"""A trainer's global counts as a step's denominators, for adapters that see one micro-batch at a time.

veRL and OpenRLHF all-reduce the step's valid-token and response counts before the first
micro-batch and hand them to the loss; masks are only known per micro-batch. So valid counts come
from the trainer (exact over the step) and kept counts are the trainer's count times this
micro-batch's kept share (exact when the share is the same across micro-batches).
"""

from __future__ import annotations

from rlstab.aggregation import StepCounts
from rlstab.lazy import torch


def number(value) -> float | None:
    """A trainer's count (int, float or 0-d tensor) as a float; None stays None."""
    if value is None:
        return None
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def with_global_counts(
    local: StepCounts, *, tokens: float | None, sequences: float | None, max_length: int, world_size: int
) -> StepCounts:
    """``local`` (this micro-batch's counts) with the trainer's global ``tokens`` / ``sequences`` (None: local)."""
    tokens_valid = local.tokens_valid if tokens is None else tokens
    sequences_valid = local.sequences_valid if sequences is None else sequences
    return StepCounts(
        tokens_valid=tokens_valid,
        tokens_kept=_share(tokens_valid, local.tokens_kept, local.tokens_valid),
        sequences_valid=sequences_valid,
        sequences_kept=_share(sequences_valid, local.sequences_kept, local.sequences_valid),
        max_length=max_length,
        world_size=world_size,
    )


def _share(total: float, part: float, whole: float) -> float:
    return total * part / whole if whole > 0 else 0.0
