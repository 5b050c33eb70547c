"""Padding changes nothing; a batch without a valid token gives a zero loss with a zero gradient.

Trainers pad responses to a common length and micro-batches to a common number of rows, with
whatever their buffers hold: zeros, garbage, NaN. A component that reads a padding position (a
row mean over every column, a maximum over the batch) changes the loss with the trainer's padding
and its micro-batch size, silently. The check fills every padding position of every float field
(``response_mask`` False; for per-response fields, the rows without a response token) with NaN,
+inf, -inf, huge finite values (+-1e38, +-3e38: a product overflows) and ordinary ones, appends
two rows of such padding, and compares the loss, the gradient and every metric with those of the
clean batch (whose padding holds other, finite, random values). The gradient of every padding
position must be exactly zero. The compiled objective zeroes non-finite padding of the fields it
checks before the components see it; finite padding (1e38) reaches them as it is.
"""

from __future__ import annotations

from rlstab.batch import SEQUENCE_MATRIX_FIELDS, TokenBatch
from rlstab.lazy import torch
from rlstab.testing.batches import DIFFERENTIABLE, advantage_modes, leaves, make_batch, take, tensors
from rlstab.testing.compare import assert_close, assert_grads_close
from rlstab.testing.hosting import family_name, host_objective
from rlstab.testing.report import checking
from rlstab.testing.running import loss_and_grad

NAN, INF = float("nan"), float("inf")
FILLS = {
    "NaN": [NAN],
    "+inf": [INF],
    "-inf": [-INF],
    "huge": [3e38, -3e38, 1e38, -1e38],
    "ordinary": [0.0, -7.0, 7.0, 1e6, -1e6, -1e-30],
}
EXTRA_ROWS = 2


def padded(batch: TokenBatch, fills: list[float], seed: int = 0) -> TokenBatch:
    """``batch`` with every padding value drawn from ``fills``, and ``EXTRA_ROWS`` rows of padding appended."""
    B, T = batch.response_mask.shape
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor(fills, dtype=torch.float32)
    mask = torch.cat([batch.response_mask, torch.zeros(EXTRA_ROWS, T, dtype=torch.bool)])
    rows = mask.any(-1)
    out = {}
    for name, value in tensors(batch).items():
        if value is None or name == "response_mask":
            continue
        value = value.detach()
        shape = (B + EXTRA_ROWS, *value.shape[1:])
        grown = torch.cat([value, torch.zeros((EXTRA_ROWS, *value.shape[1:]), dtype=value.dtype)])
        if value.is_floating_point():
            fill = values[torch.randint(len(fills), shape, generator=g)].to(value.dtype)
            keep = rows if value.dim() == 1 else (rows[:, None] if name in SEQUENCE_MATRIX_FIELDS else mask)
            out[name] = torch.where(keep, grown, fill)
        elif name == "group_ids":  # an id no response has, on padding rows
            out[name] = torch.where(rows, grown, 10_000 + torch.arange(B + EXTRA_ROWS, dtype=value.dtype))
        elif name == "is_branch":
            out[name] = torch.where(rows, grown, torch.arange(B + EXTRA_ROWS) % 2 == 0)
        else:
            out[name] = grown
    for name in DIFFERENTIABLE:
        if name in out:
            out[name] = out[name].requires_grad_()
    return TokenBatch(response_mask=mask, **out)


def check_padding_changes_nothing(component, *, host=None, seed: int = 0) -> None:
    """Loss, gradient and metrics equal those of the clean batch, whatever the padding holds; zero
    gradient on every padding position."""
    with checking(component, "check_padding_changes_nothing"):
        objective = host_objective(component, host)
        for mode in advantage_modes(family_name(component)):
            _padding_changes_nothing(objective, make_batch(objective.compile(), seed=seed, advantages=mode), mode, seed)


def _padding_changes_nothing(objective, batch: TokenBatch, mode: str, seed: int) -> None:
    clean, clean_grad = loss_and_grad(objective.compile(), batch)
    B = batch.response_mask.shape[0]
    for name, fills in FILLS.items():
        dirty = padded(batch, fills, seed)
        out, grad = loss_and_grad(objective.compile(), dirty)
        what = f"padding filled with {name} values ({', '.join(map(str, fills))}), advantages {mode}"
        assert_close(out.loss, clean.loss, f"{what}: the loss")
        assert_grads_close(grad, clean_grad, what, rows=B)
        for field, g in grad.items():
            on_padding = g[~dirty.response_mask]
            assert bool((on_padding == 0).all()), (
                f"{what}: a padding position gets gradient {on_padding[on_padding != 0][0].item()!r} with respect to {field}"
            )
        assert set(out.metrics) == set(clean.metrics), f"{what}: the metrics are {sorted(out.metrics)}"
        for key, value in clean.metrics.items():
            assert_close(out.metrics[key], value, f"{what}: metric {key}")


def check_no_valid_token_gives_zero_loss(component, *, host=None, seed: int = 0) -> None:
    """A batch whose every token is padding, and a batch of no rows, give loss 0 with zero gradient, never NaN."""
    with checking(component, "check_no_valid_token_gives_zero_loss"):
        objective = host_objective(component, host)
        full = make_batch(objective.compile(), seed=seed)
        empty_mask = make_batch(objective.compile(), seed=seed, response_mask=torch.zeros_like(full.response_mask))
        no_rows = take(full, 0, 0, leaves(full))
        for what, batch in (("a batch without response tokens", empty_mask), ("a batch of 0 rows", no_rows)):
            out, grad = loss_and_grad(objective.compile(), batch)
            assert out.loss.item() == 0.0, f"{what}: the loss is {out.loss.item()!r}, not 0"
            for name, g in grad.items():
                assert bool((g == 0).all()), f"{what}: the gradient with respect to {name} is not zero"

