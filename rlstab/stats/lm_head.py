"""Per-token log-probabilities and entropy from the last hidden states, without the logits.

The logits of a micro-batch are ``[tokens x vocabulary]``: 64k response tokens of Qwen3 (152k
vocabulary) are ~39 GB in float32, and the usual autograd path keeps several tensors of that size
(the logits, their log-softmax saved for backward, the softmax of the entropy, the backward's
gradient). [`token_stats`][rlstab.stats.token_stats] computes the same two numbers per token from
the hidden states and the LM head, a tile of logits at a time: blocks of ``chunk_size`` tokens
(``CHUNK_ROWS``) times tiles of ``VOCAB_TILE`` vocabulary entries, 4 MiB of float32 by default.

- Forward, per block: for each vocabulary tile, one matmul ``z = (h_b / T) W_t^T`` (in bits:
  ``log2(e)`` is folded into ``h_b``, so that the exponentials are ``exp2``), then a few passes
  over the tile (in cache) fold it into running per-token sums (an online softmax); the label's
  logit is picked from the tile that holds it. Only the log-sum-exp and the entropy of each token
  are kept for backward.
- Backward, per block and tile: the tile's logits are recomputed (one matmul) and turned in place
  into the gradient with respect to them, ``G = g (onehot - p)`` (plus the entropy's term when it
  carries a gradient); then ``grad_h_b += G W_t`` and ``grad_W_t += G^T h_b`` (two matmuls),
  accumulated in float32 and divided by ``T``. Tokens whose upstream gradients are zero (masked
  out, ignored, zero advantage: most tokens under a 20%-entropy mask) add exactly nothing and
  are left out of the backward's tiles, so its three matmuls shrink with the share of them.

Why tiles of both tokens and vocabulary, rather than chunks of whole rows: every matmul then has
at least 1024 rows, columns and depth, which runs at the speed of one big matmul, while a
whole-row chunk small enough for the cache (a few dozen tokens at V = 152k) makes thin matmuls
and re-reads and re-writes the whole float32 ``grad_W`` once per chunk. The price of never storing
the logits is one more matmul than autograd's path (four instead of three): the time target is
met where the naive path's passes over ``[N, V]`` memory cost more than that matmul.

When the LM head takes no gradient (frozen head, LoRA) and the entropy is detached, the backward
needs no logits at all: ``grad_h_i = g_i (W_{y_i} - sum_v p_{iv} W_v) / T``; the forward computes
the ``[N, H]`` expectation ``sum_v p_v W_v`` while it has each tile's probabilities (one matmul),
and the backward is a gather and a multiply-add: two matmuls in all, as many as autograd's path.

Extra memory, beyond the inputs and their gradients: two tile buffers, a few numbers per token, a
float32 ``[V, H]`` accumulator for ``grad_W`` when the weight is not float32, a float32 ``[N, H]``
one for ``grad_h`` when the hidden states are not, and the ``[N, H]`` expectation in the
frozen-head case. Half-precision weights are converted to float32 a tile at a time, never whole.
"""

from __future__ import annotations

from rlstab.lazy import torch
from rlstab.stats._chunk import LN2, LOG2E, _compute_dtype, backward_chunk
from rlstab.stats.backend import on_gpu, triton_imports
from rlstab.stats.lm_head_gpu import token_stats_gpu

CHUNK_ROWS = 1024
"""Tokens per block (``chunk_size=None``)."""

VOCAB_TILE = 1024
"""Vocabulary entries per tile: a block's logits are computed ``CHUNK_ROWS x VOCAB_TILE`` at a time."""


def _scaled(h: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    h = h.to(dtype)
    return h * scale if scale != 1.0 else h


def _tiles(vocab: int, tile: int):
    for v0 in range(0, vocab, tile):
        yield v0, min(v0 + tile, vocab)


def _buffer(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous ``[rows, cols]`` view of the start of a flat scratch buffer."""
    return flat[: rows * cols].view(rows, cols)


@torch.no_grad()
def _forward(hidden, weight, labels, valid, inv_temperature, rows, tile, expectation: bool):
    """``(lse, logprob, entropy, expected_weight or None)`` over all tokens.

    The logits are computed in bits (``log2(e) / T`` folded into the hidden states; see
    ``_chunk``). Per block of tokens, the vocabulary tiles are folded into running per-token sums
    (the online softmax): with the running maximum ``m``, ``S = sum_v 2^(z_v - m)`` and
    ``U = sum_v 2^(z_v - m) (z_v - m)``; when a tile raises the maximum to ``m'``, the old sums are
    rescaled by ``a = 2^(m - m')``: ``S <- a S``, ``U <- a (U + (m - m') S)``. At the end
    ``lse = ln2 (m + log2 S)`` and ``entropy = ln2 (log2 S - U / S)``.
    """
    n, dtype, device = hidden.shape[0], _compute_dtype(hidden, weight), hidden.device
    vocab = weight.shape[0]
    lse = torch.empty(n, dtype=dtype, device=device)
    logprob, entropy = torch.empty_like(lse), torch.empty_like(lse)
    expected = torch.empty(n, hidden.shape[1], dtype=dtype, device=device) if expectation else None
    size = min(rows, n) * min(tile, vocab)
    z_flat = torch.empty(size, dtype=dtype, device=device)
    e_flat = torch.empty_like(z_flat)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        h, y = _scaled(hidden[start:stop], dtype, LOG2E * inv_temperature), labels[start:stop]
        acc = expected[start:stop] if expectation else None
        label_logit = torch.zeros(stop - start, dtype=dtype, device=device)
        m = total = weighted = None
        for v0, v1 in _tiles(vocab, tile):
            w = weight[v0:v1].to(dtype)
            z, e = _buffer(z_flat, stop - start, v1 - v0), _buffer(e_flat, stop - start, v1 - v0)
            torch.mm(h, w.t(), out=z)
            local = y - v0
            inside = (local >= 0) & (local < v1 - v0)
            picked = z.gather(1, local.clamp(0, v1 - v0 - 1).unsqueeze(1)).view(-1)
            label_logit = torch.where(inside, picked, label_logit)
            tile_max = z.amax(-1)
            m_new = tile_max if m is None else torch.maximum(m, tile_max)
            z.sub_(m_new.unsqueeze(1))
            torch.exp2(z, out=e)
            tile_total = e.sum(-1)
            if expectation:
                if m is None:
                    torch.mm(e, w, out=acc)
                else:
                    acc.mul_(torch.exp2(m - m_new).unsqueeze(1)).addmm_(e, w)
            tile_weighted = z.mul_(e).sum(-1)  # in place: the tile's logits are not needed any more
            if m is None:
                total, weighted = tile_total, tile_weighted
            else:
                shift = m - m_new
                scale = torch.exp2(shift)
                weighted = scale * (weighted + shift * total) + tile_weighted
                total = scale * total + tile_total
            m = m_new
        log2_total = total.log2()
        lse[start:stop] = (m + log2_total) * LN2
        # rounding may dip below 0
        entropy[start:stop] = ((log2_total - weighted / total) * LN2).clamp_(min=0.0)
        logprob[start:stop] = ((label_logit - m) - log2_total) * LN2
        if expectation:
            acc.div_(total.unsqueeze(1))
    logprob.mul_(valid)
    return lse, logprob, entropy, expected


class _TokenStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, valid, inv_temperature, rows, tile, entropy_grad):
        # The frozen-head shortcut: the backward is then a gather and a multiply-add, no logits.
        expectation = ctx.needs_input_grad[0] and not ctx.needs_input_grad[1] and not entropy_grad
        lse, logprob, entropy, expected = _forward(
            hidden, weight, labels, valid, inv_temperature, rows, tile, expectation
        )
        ctx.save_for_backward(hidden, weight, labels, valid, lse, entropy, expected)
        ctx.inv_temperature, ctx.rows, ctx.tile, ctx.entropy_grad = inv_temperature, rows, tile, entropy_grad
        ctx.expectation = expectation
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        hidden, weight, labels, valid, lse, entropy, expected = ctx.saved_tensors
        dtype, inv_t, device = lse.dtype, ctx.inv_temperature, hidden.device
        n, hidden_dtype = hidden.shape[0], hidden.dtype
        g = torch.zeros(n, dtype=dtype, device=device) if grad_logprob is None else grad_logprob.to(dtype)
        g = g * valid  # ignored tokens: constant log-prob 0, no gradient
        g_ent = grad_entropy.to(dtype) if (ctx.entropy_grad and grad_entropy is not None) else None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        none = (None,) * 6
        if ctx.expectation:
            # grad_h_i = g_i (W_{y_i} - E_p[W]) / T
            grad_h = (weight[labels].to(dtype) - expected).mul_((g * inv_t).unsqueeze(1))
            return (grad_h.to(hidden.dtype), None) + none
        # Tokens whose upstream gradients are all zero (masked out, zero advantage) contribute
        # exactly nothing: the tiles are computed for the others only.
        active = g != 0 if g_ent is None else (g != 0) | (g_ent != 0)
        kept = None if bool(active.all()) else active.nonzero().view(-1)
        if kept is not None:
            hidden, labels, lse, g = hidden[kept], labels[kept], lse[kept], g[kept]
            entropy, g_ent = (entropy[kept], g_ent[kept]) if g_ent is not None else (entropy, None)
        grad_h, grad_w = _backward(
            hidden, weight, labels, lse, g, entropy, g_ent, inv_t, ctx.rows, ctx.tile, need_h, need_w
        )
        if need_h and kept is not None:
            grad_h = torch.zeros(n, hidden.shape[1], dtype=dtype, device=device).index_copy_(0, kept, grad_h)
        return (
            grad_h.to(hidden_dtype) if need_h else None,
            grad_w.to(weight.dtype) if need_w else None,
        ) + none


@torch.no_grad()
def _backward(hidden, weight, labels, lse, g, entropy, g_ent, inv_t, rows, tile, need_h, need_w):
    """``(grad_h, grad_W)`` in the compute dtype (None where not needed), a tile of logits at a time."""
    dtype, device = lse.dtype, hidden.device
    n, vocab = hidden.shape[0], weight.shape[0]
    grad_h = torch.empty(hidden.shape, dtype=dtype, device=device) if need_h else None
    grad_w = None
    if need_w:  # float32 accumulation; the first block writes, the others add
        grad_w = (torch.zeros if n == 0 else torch.empty)(weight.shape, dtype=dtype, device=device)
    size = min(rows, n) * min(tile, vocab)
    z_flat = torch.empty(size, dtype=dtype, device=device)
    e_flat = torch.empty_like(z_flat) if g_ent is not None else None
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        sl = slice(start, stop)
        h = hidden[sl].to(dtype)
        h_bits = h * (LOG2E * inv_t)  # the logits in bits, as in the forward
        h_scaled = h * inv_t if inv_t != 1.0 else h  # grad_W = G^T (h / T)
        y = labels[sl]
        for v0, v1 in _tiles(vocab, tile):
            w = weight[v0:v1].to(dtype)
            z = _buffer(z_flat, stop - start, v1 - v0)
            torch.mm(h_bits, w.t(), out=z)
            local = y - v0
            inside = (local >= 0) & (local < v1 - v0)
            backward_chunk(
                z, local.clamp(0, v1 - v0 - 1), lse[sl], g[sl],
                entropy[sl] if g_ent is not None else None,
                g_ent[sl] if g_ent is not None else None,
                _buffer(e_flat, stop - start, v1 - v0) if g_ent is not None else None,
                grad_label=g[sl] * inside,
            )
            if need_h:
                if v0 == 0:
                    torch.mm(z, w, out=grad_h[sl])
                else:
                    grad_h[sl].addmm_(z, w)
            if need_w:
                if start == 0:
                    torch.mm(z.t(), h_scaled, out=grad_w[v0:v1])
                else:
                    grad_w[v0:v1].addmm_(z.t(), h_scaled)
    if need_h and inv_t != 1.0:
        grad_h.mul_(inv_t)
    return grad_h, grad_w


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
    ``[N, V]`` logits are never materialised (see [`rlstab.stats.lm_head`][rlstab.stats.lm_head]
    for how, and what memory it takes).

    Args:
        hidden: ``[..., H]`` last hidden states (any float dtype).
        weight: ``[V, H]`` LM-head weight (a tied embedding works as is). A bias-free head is
            assumed, as in the models RL trains (Llama, Qwen, Mistral).
        labels: ``[...]`` (``hidden.shape[:-1]``) integer token ids; ``ignore_index`` marks tokens
            without a label (their log-probability is 0 and takes no gradient; their entropy is
            computed).
        temperature: the sampling temperature the rollout used (> 0).
        chunk_size: tokens per block (``CHUNK_ROWS`` when None); a block's logits are computed
            ``VOCAB_TILE`` vocabulary entries at a time.
        entropy_grad: give the entropy a gradient (for an entropy bonus). By default it is
            detached, which is what masks and thresholds need, and costs nothing in backward.
        ignore_index: the label value of tokens without a label.

    Returns:
        ``(logprobs, entropy)``, each of ``labels``' shape, in float32 (float64 for float64
        inputs). ``logprobs`` carries the gradient to ``hidden`` and ``weight``, accumulated in
        float32 and returned in their dtypes.

    Where it runs: CUDA tensors (float16, bfloat16, float32) take the GPU path
    ([`lm_head_gpu`][rlstab.stats.lm_head_gpu]): the four matmuls by cuBLAS in the head's dtype
    with float32 accumulation, the softmax passes by the Triton row kernels (torch ones without
    Triton), over chunks sized for the GPU; ``chunk_size`` is ignored there, and the hidden states
    are taken in the head's dtype, as the model's own head takes them. Everything else (CPU,
    float64) runs the path described above, the reference.
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
    if on_gpu(hidden, weight):  # cuBLAS matmuls and row kernels over GPU-sized chunks (lm_head_gpu)
        logprob, entropy = token_stats_gpu(
            h.to(weight.dtype), weight, y.to(torch.int64), temperature=temperature, entropy_grad=entropy_grad,
            ignore_index=ignore_index, use_triton=triton_imports(),
        )
        return logprob.view(shape), entropy.view(shape)
    valid = y != ignore_index
    safe = torch.where(valid, y, torch.zeros((), dtype=y.dtype, device=y.device)).to(torch.int64)
    dtype = _compute_dtype(hidden, weight)
    valid = valid.to(dtype)
    rows = chunk_size or CHUNK_ROWS
    inv_t = 1.0 / float(temperature)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        logprob, entropy = _TokenStats.apply(h, weight, safe, valid, inv_t, rows, VOCAB_TILE, entropy_grad)
    else:
        _, logprob, entropy, _ = _forward(h, weight, safe, valid, inv_t, rows, VOCAB_TILE, expectation=False)
    return logprob.view(shape), entropy.view(shape)
