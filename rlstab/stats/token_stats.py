"""Per-token log-probabilities and entropy from the last hidden states, without the logits.

The logits of a micro-batch are ``[tokens x vocabulary]``: 64k response tokens of Qwen3 (152k
vocabulary) are ~39 GB in float32, and the usual autograd path keeps several tensors of that size
(the logits, their log-softmax saved for backward, the softmax of the entropy, the backward's
gradient). [`token_stats`][rlstab.stats.token_stats] computes the same two numbers per token from
the hidden states and the LM head in chunks of tokens, and never holds more than one chunk's
logits:

- forward, per chunk: one matmul ``z = (h_c / T) W^T``, then the log-sum-exp, the label's
  log-probability and the entropy in a few in-place passes over the chunk (see
  ``rlstab/stats/_chunk.py`` for the formulas). Only the log-sum-exp of each token is kept.
- backward, per chunk: the logits are recomputed (one matmul), turned in place into the gradient
  with respect to them, ``G = g (onehot - p)`` (plus the entropy's term when it carries a
  gradient), and multiplied out: ``grad_h_c = G W / T`` and ``grad_W += G^T h_c / T``, accumulated
  in float32.

When the LM head takes no gradient (frozen head, LoRA) and the entropy is detached, the backward
needs no logits at all: ``grad_h_i = g_i (W_{y_i} - sum_v p_{iv} W_v) / T``, and the forward
computes the ``[N, H]`` expectation ``sum_v p_v W_v`` while it has the chunk's probabilities (one
matmul, instead of two in the backward).

Extra memory, beyond the inputs and the gradients themselves: one or two chunk buffers
(``chunk_size x V`` numbers each), a few numbers per token, an ``[N, H]`` float32 tensor in the
frozen-head case, and, for bfloat16/float16 weights, one float32 copy of the LM head (the matmuls
accumulate and return float32; CPU torch has no half-precision matmul with a float32 output).
"""

from __future__ import annotations

import torch

from rlstab.stats._chunk import backward_chunk, forward_chunk

CHUNK_BYTES = 32 << 20
"""Target size of one chunk's logits buffer (bytes); ``chunk_size=None`` picks the rows from it."""

MIN_CHUNK_ROWS, MAX_CHUNK_ROWS = 16, 4096


def default_chunk_rows(vocab: int, itemsize: int = 4) -> int:
    """Rows per chunk so that a chunk's logits take about ``CHUNK_BYTES`` (a multiple of 16 rows).

    Why this size: the chunk's passes (max, exp, sums) then run on memory that stays in the last
    level cache, and the ``[rows, H] x [H, V]`` matmuls still have enough rows to run near the
    speed of one big matmul (measured in ``benchmarks/token_stats.py``).
    """
    rows = CHUNK_BYTES // max(1, vocab * itemsize)
    return int(min(MAX_CHUNK_ROWS, max(MIN_CHUNK_ROWS, rows // 16 * 16)))


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when an input is float64 (exact references), otherwise float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _scaled(h: torch.Tensor, dtype: torch.dtype, inv_temperature: float) -> torch.Tensor:
    h = h.to(dtype)
    return h * inv_temperature if inv_temperature != 1.0 else h


def _forward(hidden, weight, labels, valid, inv_temperature, chunk, expectation: bool):
    """``(lse, logprob, entropy, expected_weight or None)`` over all tokens, chunk by chunk."""
    n, dtype = hidden.shape[0], _compute_dtype(hidden, weight)
    w = weight.to(dtype)
    lse = torch.empty(n, dtype=dtype, device=hidden.device)
    logprob, entropy = torch.empty_like(lse), torch.empty_like(lse)
    expected = torch.empty(n, hidden.shape[1], dtype=dtype, device=hidden.device) if expectation else None
    rows = min(chunk, n)
    z_buf = torch.empty(rows, w.shape[0], dtype=dtype, device=hidden.device)
    e_buf = torch.empty_like(z_buf)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        z, e = z_buf[: stop - start], e_buf[: stop - start]
        torch.mm(_scaled(hidden[start:stop], dtype, inv_temperature), w.t(), out=z)
        lse[start:stop], logprob[start:stop], entropy[start:stop], total = forward_chunk(z, labels[start:stop], e)
        if expectation:
            # e holds exp(z - max): sum_v p_v W_v = (e W) / sum_v e_v
            torch.mm(e, w, out=expected[start:stop])
            expected[start:stop] /= total.unsqueeze(1)
    logprob.mul_(valid)
    return lse, logprob, entropy, expected


class _TokenStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, valid, inv_temperature, chunk, entropy_grad):
        # The frozen-head shortcut: the backward is then a gather and a multiply-add, no logits.
        expectation = ctx.needs_input_grad[0] and not ctx.needs_input_grad[1] and not entropy_grad
        lse, logprob, entropy, expected = _forward(hidden, weight, labels, valid, inv_temperature, chunk, expectation)
        ctx.save_for_backward(hidden, weight, labels, valid, lse, entropy, expected)
        ctx.inv_temperature, ctx.chunk, ctx.entropy_grad = inv_temperature, chunk, entropy_grad
        ctx.expectation = expectation
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        hidden, weight, labels, valid, lse, entropy, expected = ctx.saved_tensors
        dtype, inv_t = lse.dtype, ctx.inv_temperature
        n = hidden.shape[0]
        g = torch.zeros(n, dtype=dtype, device=hidden.device) if grad_logprob is None else grad_logprob.to(dtype)
        g = g * valid  # ignored tokens: constant log-prob 0, no gradient
        g_ent = grad_entropy.to(dtype) if (ctx.entropy_grad and grad_entropy is not None) else None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.expectation:
            # grad_h_i = g_i (W_{y_i} - E_p[W]) / T
            grad_h = (weight[labels].to(dtype) - expected).mul_((g * inv_t).unsqueeze(1))
            return grad_h.to(hidden.dtype), None, None, None, None, None, None
        w = weight.to(dtype)
        grad_h = torch.empty(hidden.shape, dtype=dtype, device=hidden.device) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=dtype, device=w.device) if need_w else None
        rows = min(ctx.chunk, n)
        z_buf = torch.empty(rows, w.shape[0], dtype=dtype, device=hidden.device)
        e_buf = torch.empty_like(z_buf) if g_ent is not None else None
        for start in range(0, n, ctx.chunk):
            stop = min(start + ctx.chunk, n)
            z = z_buf[: stop - start]
            h = _scaled(hidden[start:stop], dtype, inv_t)
            torch.mm(h, w.t(), out=z)
            sl = slice(start, stop)
            backward_chunk(
                z, labels[sl], lse[sl], g[sl],
                entropy[sl] if g_ent is not None else None,
                g_ent[sl] if g_ent is not None else None,
                e_buf[: stop - start] if g_ent is not None else None,
            )
            if need_h:
                torch.mm(z, w, out=grad_h[sl])
                if inv_t != 1.0:
                    grad_h[sl] *= inv_t
            if need_w:
                grad_w.addmm_(z.t(), h)
        return (
            grad_h.to(hidden.dtype) if need_h else None,
            grad_w.to(weight.dtype) if need_w else None,
            None, None, None, None, None,
        )


def token_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each label and entropy of each next-token distribution, from hidden states.

    The distribution of token ``i`` is ``softmax(hidden_i @ weight.T / temperature)``; the full
    ``[N, V]`` logits are never materialised (see the module docstring for how, and what memory it
    takes).

    Args:
        hidden: ``[..., H]`` last hidden states (any float dtype).
        weight: ``[V, H]`` LM-head weight (a tied embedding works as is). A bias-free head is
            assumed, as in the models RL trains (Llama, Qwen, Mistral).
        labels: ``[...]`` (``hidden.shape[:-1]``) integer token ids; ``ignore_index`` marks tokens
            without a label (their log-probability is 0 and takes no gradient; their entropy is
            computed).
        temperature: the sampling temperature the rollout used (> 0).
        chunk_size: tokens per chunk; None picks ``default_chunk_rows(V)`` (about 32 MiB of
            logits). Smaller saves memory, larger may run faster on a GPU.
        entropy_grad: give the entropy a gradient (for an entropy bonus). By default it is
            detached, which is what masks and thresholds need, and costs nothing in backward.
        ignore_index: the label value of tokens without a label.

    Returns:
        ``(logprobs, entropy)``, each of ``labels``' shape, in float32 (float64 for float64
        inputs). ``logprobs`` carries the gradient to ``hidden`` and ``weight``, accumulated in
        float32 and returned in their dtypes.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"labels {tuple(labels.shape)} must be hidden's shape without its last dimension {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must be [V, H] with H = {hidden.shape[-1]}, got {tuple(weight.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = labels.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    valid = y != ignore_index
    safe = torch.where(valid, y, torch.zeros((), dtype=y.dtype, device=y.device)).to(torch.int64)
    dtype = _compute_dtype(hidden, weight)
    valid = valid.to(dtype)
    chunk = chunk_size or default_chunk_rows(weight.shape[0], torch.finfo(dtype).bits // 8)
    inv_t = 1.0 / float(temperature)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        logprob, entropy = _TokenStats.apply(h, weight, safe, valid, inv_t, chunk, entropy_grad)
    else:
        _, logprob, entropy, _ = _forward(h, weight, safe, valid, inv_t, chunk, expectation=False)
    return logprob.view(shape), entropy.view(shape)
