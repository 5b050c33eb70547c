"""Offending inputs: a NaN or infinity, a log-prob above 0 or an entropy below 0 (beyond rounding), found,
zeroed on padding, and raised on a valid token. The compiler's one place for them.

Trainers pad with anything (NaN included), so the loss must not care what padding holds; such a
value on a token the loss trains on is a bug upstream, reported with the field, the count and the
first index (a non-finite value: ``FloatingPointError``) or the worst value and the likely mistake
(a value beyond its field's limits, ``rlstab.batch.VALUE_LIMITS``: ``BatchError``) rather than
trained on. "Valid" means a response token (``response_mask``, before rollout rejection and
dynamic sampling); for a per-response field (rewards, ``[B]`` advantages) a response with at least
one response token.

Checking costs nothing on the usual path: the compiled loss compares the extremes of each field
(``aminmax``: min and max are finite iff every value is, NaN propagating; the max of log-probs and
the min of the entropy are within their limits iff every value is) within the metrics' transfer
(``value_check``), and ``gather`` within the counts' reduction (``offending_flag``). Either raises
``OffendingInputs`` when a value offends anywhere, padding included; ``retried_without_bad_padding``
catches it, cleans the batch (``without_bad_padding``: the padding's offending values zeroed, the
first offence on a valid token raised; ``without_bad_padding_on_every_rank`` for a step) and runs
the step once more. ``OffendingInputs`` never leaves the compiler. A call that reads nothing on the
host (a frozen step on a GPU) cannot redo itself: it zeroes every padding value up front instead
(``zeroed_up_front``), and what is left offending is on valid tokens, raised when its metrics are
read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

from rlstab.batch import (
    LIKELY_MISTAKES,
    ROUNDING,
    SEQUENCE_FIELDS,
    SEQUENCE_MATRIX_FIELDS,
    TOKEN_FIELDS,
    VALUE_LIMITS,
    VALUE_RULES,
    BatchError,
    TokenBatch,
)
from rlstab.comm import Comm
from rlstab.deferred import AllFinite, Requirement
from rlstab.lazy import torch

# Every field that can be checked, in a fixed order (a reduction over ranks needs one).
_FIELDS = TOKEN_FIELDS + ("advantages", "is_weights") + SEQUENCE_FIELDS + SEQUENCE_MATRIX_FIELDS
_NON_FINITE, _BEYOND_LIMITS = 0, 1  # the two kinds of offence, each counted per field over ranks

Batches = TypeVar("Batches")  # a TokenBatch, or a step's list of them
Result = TypeVar("Result")


class OffendingInputs(Exception):
    """A checked input holds a value that is not finite or beyond its field's limits, somewhere (padding
    perhaps): raised by a loss's read or a step's gather, caught by ``retried_without_bad_padding``, which
    cleans the batch and runs again. Internal to the compiler: it never reaches a caller of the loss."""


def retried_without_bad_padding(
    run: Callable[[Batches], Result], inputs: Batches, clean: Callable[[Batches], Batches]
) -> Result:
    """``run(inputs)``; when it raises ``OffendingInputs``, ``run(clean(inputs))`` once.

    ``clean`` zeroes the padding's offending values and raises the first offence on a valid token
    (``without_bad_padding``, or ``without_bad_padding_on_every_rank`` for a step's micro-batches), so
    the second run finds nothing: an ``OffendingInputs`` from it is a bug (``AssertionError``).
    """
    try:
        return run(inputs)
    except OffendingInputs:
        pass  # cleaned outside the handler: an error of ``clean`` does not chain onto this one
    try:
        return run(clean(inputs))
    except OffendingInputs:
        raise AssertionError("offending inputs remained after zeroing the padding") from None


class Offence(NamedTuple):
    """Values of one field on valid tokens that cannot be right."""

    field: str
    count: int
    kind: int
    """``_NON_FINITE`` or ``_BEYOND_LIMITS``."""
    error: Exception
    """What to raise: it names the field, the count and the first (or the worst) value."""


def extremes(batch: TokenBatch, fields: list[str]) -> list[torch.Tensor]:
    """Min and max (0-d tensors) of each non-empty field: all finite iff every value is."""
    with torch.no_grad():  # no graph, and no detach dispatched per field
        return [v for f in fields for x in [getattr(batch, f)] if x.numel() for v in torch.aminmax(x)]


def within_limits(batch: TokenBatch, fields: list[str]) -> AllFinite | None:
    """The condition that every value of ``fields`` is finite and within its field's limits, judged on the host
    from each field's extremes (no operation on the device but the extremes); None without a value."""
    values = extremes(batch, fields)
    if not values:
        return None
    limits = tuple(VALUE_LIMITS.get(f, AllFinite.NO_LIMITS) for f in fields if getattr(batch, f).numel() for _ in (0, 1))
    return AllFinite(tuple(values), limits)


def value_check(batch: TokenBatch, fields: list[str], error: Callable[[], Exception]) -> list[Requirement]:
    """The requirement that every value of ``fields`` is sound (``within_limits``), failing with ``error()``, to
    ride on the metrics' read: ``[]`` without a value to check."""
    sound = within_limits(batch, fields)
    return [] if sound is None else [(sound, error)]


def offending_flag(batch: TokenBatch, fields: list[str]) -> torch.Tensor:
    """``[1]`` bool: whether one of ``fields`` holds a value that is not finite in float32, or beyond its field's
    limits (no host synchronisation). Their extremes times 0 (0 when finite, NaN when not: a NaN or an infinity
    times 0 is NaN), and how far the extremes of the fields with limits lie beyond them, at least 0, summed in
    one stack: 0 when every value is sound. Five operations and one per limit (four without limits), where
    ``isfinite(...).any()`` alone dispatches six."""
    values = [v.to(torch.float32) for v in extremes(batch, fields)]
    if not values:
        return torch.zeros(1, dtype=torch.bool, device=batch.logprobs.device)
    present = [f for f in fields if getattr(batch, f).numel()]
    beyond = [excess for i, f in enumerate(present) if f in VALUE_LIMITS
              for excess in _excess(values[2 * i], values[2 * i + 1], *VALUE_LIMITS[f])]
    stacked = torch.stack(values + beyond)
    stacked[:len(values)].mul_(0.0)
    if beyond:
        stacked[len(values):].clamp_min_(0.0)
    return stacked.sum(0, keepdim=True).ne(0.0)  # NaN compares unequal


def _excess(low_value: torch.Tensor, high_value: torch.Tensor, low: float, high: float) -> list[torch.Tensor]:
    """How far a field's min lies below ``low`` and its max above ``high`` (negative within; only finite limits)."""
    return ([low - low_value] if low > float("-inf") else []) + ([high_value - high] if high < float("inf") else [])


def zero_bad_padding(batch: TokenBatch, fields: list[str]) -> tuple[TokenBatch, list[Offence]]:
    """``batch`` with the values of ``fields`` on padding that are not finite or beyond their field's limits
    zeroed, and the offences on valid tokens (a field's non-finite values first: its other values then mean
    nothing)."""
    mask = batch.response_mask
    replace, offences = {}, []
    for name in fields:
        value = getattr(batch, name)
        seen = value.detach().to(torch.float32)  # as the loss will see it
        bad = ~torch.isfinite(seen)
        low, high = VALUE_LIMITS.get(name, AllFinite.NO_LIMITS)
        beyond = (seen < low) | (seen > high)
        if not (bad.any() or beyond.any()):
            continue
        valid = _valid_of(name, value, mask)
        offence = _non_finite(name, value, bad & valid) or _beyond_limits(name, seen, beyond & valid, low, high)
        if offence is not None:
            offences.append(offence)
            continue
        replace[name] = torch.where(bad | beyond, torch.zeros((), dtype=value.dtype, device=value.device), value)
    kept = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    kept.update(replace)
    return TokenBatch(**kept), offences


def _non_finite(name: str, value: torch.Tensor, on_valid: torch.Tensor) -> Offence | None:
    """The offence of a field's non-finite values on valid tokens, or None."""
    if not on_valid.any():
        return None
    where = on_valid.nonzero()[0].tolist()
    count = int(on_valid.sum())
    return Offence(name, count, _NON_FINITE, FloatingPointError(
        f"TokenBatch.{name} has {count} value(s) on valid tokens that are not finite in float32 "
        f"(first at index {where}: {value[tuple(where)].item()})"
    ))


def _beyond_limits(name: str, seen: torch.Tensor, on_valid: torch.Tensor, low: float, high: float) -> Offence | None:
    """The offence of a field's values beyond its limits on valid tokens (all finite), or None: how many, and the
    worst of them (the largest log-prob, the smallest entropy) with its index."""
    if not on_valid.any():
        return None
    above = bool((seen > high).logical_and(on_valid).any())
    scores = torch.where(on_valid, seen if above else -seen, float("-inf"))
    worst = int(scores.argmax())
    where = list(divmod(worst, seen.shape[-1])) if seen.dim() == 2 else [worst]
    count = int(on_valid.sum())
    return Offence(name, count, _BEYOND_LIMITS, BatchError(
        f"TokenBatch.{name} has {count} value(s) on valid tokens {_beyond(name)}, the {'largest' if above else 'smallest'} "
        f"{seen[tuple(where)].item():.6g} at index {where}: {VALUE_RULES[name]} ({ROUNDING:g} allows for rounding). "
        f"{LIKELY_MISTAKES[name]}"
    ))


def _beyond(name: str) -> str:
    """``above 0.5`` or ``below -0.5``: where a field's values offend."""
    low, high = VALUE_LIMITS[name]
    return f"above {high:g}" if high < float("inf") else f"below {low:g}"


def with_padding_zeroed(batch: TokenBatch, fields: list[str]) -> TokenBatch:
    """``batch`` with every floating value of ``fields`` on padding set to 0, reading nothing on the host.

    Where ``zero_bad_padding`` looks for the offending values
    first (host reads), this writes a ``where`` per field unconditionally: a NaN (or a log-prob above 0)
    on padding can then change nothing, and what is left offending is on valid tokens (the deferred
    check's business). Gradients flow through to the original tensors (0 on padding).
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


def zeroed_up_front(batch: TokenBatch, fields: list[str]) -> tuple[TokenBatch, Callable[[], Exception]]:
    """For a call that reads nothing on the host: ``batch`` with every value of ``fields`` on padding zeroed
    (``with_padding_zeroed``), and the error of the first offence on a valid token, to call at the metrics'
    read only when one offends (it reads the original ``batch``, then, on the host)."""

    def first_offence() -> Exception:
        _, offences = zero_bad_padding(batch, fields)
        return offences[0].error

    return with_padding_zeroed(batch, fields), first_offence


def _valid_of(name: str, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Where ``value`` is valid: its response's row (``[B]``, and ``[B, K]`` per-response columns), or its token."""
    if value.dim() == 1:
        return mask.any(-1)
    return mask.any(-1, keepdim=True) if name in SEQUENCE_MATRIX_FIELDS else mask


def without_bad_padding(batch: TokenBatch, fields: list[str]) -> TokenBatch:
    """``batch`` with offending padding zeroed; the first offence on a valid token raised (``FloatingPointError``
    for a non-finite value, ``BatchError`` for one beyond its field's limits)."""
    cleaned, offences = zero_bad_padding(batch, fields)
    if offences:
        raise offences[0].error
    return cleaned


def without_bad_padding_on_every_rank(
    batches: list[TokenBatch], fields_of: Callable[[TokenBatch], list[str]], comm: Comm
) -> list[TokenBatch]:
    """Each rank's ``batches`` with offending padding zeroed; on every rank, when any rank has an offending
    value on a valid token, its error (the counts are reduced, so all ranks raise together instead of some
    waiting in the next collective)."""
    cleaned, offences = [], []
    for batch in batches:
        clean, found = zero_bad_padding(batch, fields_of(batch))
        cleaned.append(clean)
        offences += found
    local = torch.zeros(2 * len(_FIELDS), dtype=torch.float64)  # per kind of offence, per field
    for offence in offences:
        local[offence.kind * len(_FIELDS) + _FIELDS.index(offence.field)] += offence.count
    device = batches[0].logprobs.device if batches else torch.device("cpu")
    totals = comm.sum(local.to(device)).tolist()
    if not any(totals):
        return cleaned
    if offences:
        raise offences[0].error
    kind, i = divmod(next(i for i, n in enumerate(totals) if n), len(_FIELDS))
    name, count = _FIELDS[i], int(totals[kind * len(_FIELDS) + i])
    if kind == _NON_FINITE:
        raise FloatingPointError(
            f"TokenBatch.{name} has {count} value(s) on valid tokens that are not finite in float32, on another rank"
        )
    raise BatchError(
        f"TokenBatch.{name} has {count} value(s) on valid tokens {_beyond(name)}, on another rank: {VALUE_RULES[name]} "
        f"({ROUNDING:g} allows for rounding). {LIKELY_MISTAKES[name]}"
    )
