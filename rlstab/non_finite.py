"""Non-finite inputs: a NaN or infinity on padding is zeroed and ignored, one on a valid token is an error.

Trainers pad with anything (NaN included), so the loss must not care what padding holds; a
non-finite value on a token the loss trains on is a bug upstream, reported with the field, the
count and the first index rather than turned into a NaN loss. "Valid" means a response token
(``response_mask``, before rollout rejection and dynamic sampling); for a per-response field
(rewards, ``[B]`` advantages) a response with at least one response token.

Checking costs nothing on the usual path: the compiled loss compares the extremes of each field
(``aminmax``: min and max are finite iff every value is, NaN propagating) within the metrics'
transfer, and ``gather`` within the counts' reduction; only a batch that fails is cleaned here and
its step recomputed. A call that reads nothing on the host (a frozen step on a GPU) cannot redo
itself: it zeroes every padding value up front instead (``with_padding_zeroed``), and what is left
non-finite is on valid tokens, raised when its metrics are read.
"""

from __future__ import annotations

from collections.abc import Callable

from rlstab.batch import SEQUENCE_FIELDS, SEQUENCE_MATRIX_FIELDS, TOKEN_FIELDS, TokenBatch
from rlstab.comm import Comm
from rlstab.lazy import torch

# Every field that can be checked, in a fixed order (a reduction over ranks needs one).
_FIELDS = TOKEN_FIELDS + ("advantages", "is_weights") + SEQUENCE_FIELDS + SEQUENCE_MATRIX_FIELDS

Offence = tuple[str, int, str]  # (field, count, description of the first value)


def extremes(batch: TokenBatch, fields: list[str]) -> list[torch.Tensor]:
    """Min and max (0-d tensors) of each non-empty field: all finite iff every value is."""
    with torch.no_grad():  # no graph, and no detach dispatched per field
        return [v for f in fields for x in [getattr(batch, f)] if x.numel() for v in torch.aminmax(x)]


def non_finite_flag(batch: TokenBatch, fields: list[str]) -> torch.Tensor:
    """``[1]`` bool: whether one of ``fields`` holds a value that is not finite in float32 (no host
    synchronisation). Their extremes times 0, summed: 0 when every one is finite, NaN when one is not
    (a NaN or an infinity times 0 is NaN): four operations where ``isfinite(...).any()`` dispatches six."""
    values = extremes(batch, fields)
    if not values:
        return torch.zeros(1, dtype=torch.bool, device=batch.logprobs.device)
    return torch.stack([v.to(torch.float32) for v in values]).mul_(0.0).sum(0, keepdim=True).isnan()


def zero_bad_padding(batch: TokenBatch, fields: list[str]) -> tuple[TokenBatch, list[Offence]]:
    """``batch`` with the non-finite values of ``fields`` on padding zeroed, and the fields that hold
    non-finite values on valid tokens."""
    mask = batch.response_mask
    replace, offences = {}, []
    for name in fields:
        value = getattr(batch, name)
        bad = ~torch.isfinite(value.detach().to(torch.float32))  # as the loss will see it
        if not bad.any():
            continue
        on_valid = bad & _valid_of(name, value, mask)
        if on_valid.any():
            where = on_valid.nonzero()[0].tolist()
            offences.append((
                name,
                int(on_valid.sum()),
                f"value(s) on valid tokens that are not finite in float32 (first at index {where}: "
                f"{value[tuple(where)].item()})",
            ))
            continue
        replace[name] = torch.where(bad, torch.zeros((), dtype=value.dtype, device=value.device), value)
    kept = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    kept.update(replace)
    return TokenBatch(**kept), offences


def with_padding_zeroed(batch: TokenBatch, fields: list[str]) -> TokenBatch:
    """``batch`` with every floating value of ``fields`` on padding set to 0, reading nothing on the host.

    Where [`zero_bad_padding`][rlstab.non_finite.zero_bad_padding] looks for the non-finite values
    first (host reads), this writes a ``where`` per field unconditionally: a NaN on padding can then
    change nothing, and what is left non-finite is on valid tokens (the deferred check's business).
    Gradients flow through to the original tensors (0 on padding).
    """
    mask = batch.response_mask
    zeroed = {}
    valid = {}  # per layout (token, response, response column): where a value is valid, computed once
    for name in fields:
        value = getattr(batch, name)
        if value is not None and value.is_floating_point():
            layout = (value.dim() == 1, name in SEQUENCE_MATRIX_FIELDS)
            if layout not in valid:
                valid[layout] = _valid_of(name, value, mask)
            zeroed[name] = torch.where(valid[layout], value, 0.0)  # the same shape, dtype and device
    return batch._replaced(**zeroed)


def _valid_of(name: str, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Where ``value`` is valid: its response's row (``[B]``, and ``[B, K]`` per-response columns), or its token."""
    if value.dim() == 1:
        return mask.any(-1)
    return mask.any(-1, keepdim=True) if name in SEQUENCE_MATRIX_FIELDS else mask


def without_bad_padding(batch: TokenBatch, fields: list[str]) -> TokenBatch:
    """``batch`` with non-finite padding zeroed; ``FloatingPointError`` for a non-finite valid value."""
    cleaned, offences = zero_bad_padding(batch, fields)
    if offences:
        name, count, where = offences[0]
        raise FloatingPointError(f"TokenBatch.{name} has {count} {where}")
    return cleaned


def without_bad_padding_on_every_rank(
    batches: list[TokenBatch], fields_of: Callable[[TokenBatch], list[str]], comm: Comm
) -> list[TokenBatch]:
    """Each rank's ``batches`` with non-finite padding zeroed; ``FloatingPointError`` on every rank when
    any rank has a non-finite value on a valid token (the counts are reduced, so all ranks raise together
    instead of some waiting in the next collective)."""
    cleaned, offences = [], []
    for batch in batches:
        clean, found = zero_bad_padding(batch, fields_of(batch))
        cleaned.append(clean)
        offences += found
    local = torch.zeros(len(_FIELDS), dtype=torch.float64)
    for name, count, _ in offences:
        local[_FIELDS.index(name)] += count
    device = batches[0].logprobs.device if batches else torch.device("cpu")
    totals = comm.sum(local.to(device)).tolist()
    if not any(totals):
        return cleaned
    if offences:
        name, count, where = offences[0]
        raise FloatingPointError(f"TokenBatch.{name} has {count} {where}")
    i = next(i for i, n in enumerate(totals) if n)
    raise FloatingPointError(
        f"TokenBatch.{_FIELDS[i]} has {int(totals[i])} value(s) on valid tokens that are not finite in float32, on another rank"
    )
