"""The Triton kernels of ``token_stats_from_logits``: one program per token (row of the logits).

Same arithmetic as the CPU path (``rlstab/stats/_chunk.py``), in base 2 and float32 whatever the
logits' dtype: ``z_v = max(log2(e) * logit_v / T, lowest float32)``, so that a ``-inf`` logit (a
masked vocabulary) has probability exactly 0 and adds nothing to the entropy.

Forward, one pass over the row in tiles of ``BLOCK_V`` with a running maximum ``m`` and, relative
to it, ``S = sum_v 2^(z_v - m)`` and ``W = sum_v 2^(z_v - m) (z_v - m)``. When a tile raises the
maximum from ``m`` to ``m'``, the sums are moved to the new reference with ``a = 2^(m - m')``::

    S <- a S                    W <- a (W + (m - m') S)

(``(a (m - m')) S`` is formed in that order: ``a`` is 0 whenever ``m - m'`` is huge, as after tiles
of masked logits at the lowest float, so the product stays 0 instead of ``0 * inf``.) At the end::

    lse = ln2 (m + log2 S)   logprob = ln2 (z_y - m - log2 S)   entropy = ln2 (log2 S - W / S) >= 0

Backward, one read of the row and one write of its gradient, with ``log2 p_v = (z_v - m) - log2 S``
(the two numbers the forward kept, so no term is of the size of ``m``), ``g`` (log-prob) and ``gH``
(entropy) the upstream gradients::

    G_v = (g onehot_y(v) - p_v (g + gH (max(log p_v, -1000) + entropy))) / T

The floor at ``log p = -1000`` (where ``p`` is 0 exactly) keeps ``gH log p`` finite for masked
logits, as on the CPU path.

Offsets are int64 (``N x V`` may pass 2^31) and built from the row and column strides, so that
transposed or sliced logits need no copy. The comparisons ``z < lowest`` (not ``maximum``) keep a
NaN logit NaN, as the CPU path does.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOWEST: tl.constexpr = tl.constexpr(-3.4028234663852886e38)  # float32's lowest finite value
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _bits(row_ptr, cols, inside, stride_v, scale):
    """A tile of logits in bits, ``max(log2(e) logit / T, lowest float32)``; lanes past the vocabulary at the lowest."""
    x = tl.load(row_ptr + cols.to(tl.int64) * stride_v, mask=inside, other=float("-inf"))
    z = x.to(tl.float32) * scale
    return tl.where(z < LOWEST, LOWEST, z)


@triton.jit
def logit_stats_forward(
    logits_ptr,
    stride_n,
    stride_v,
    labels_ptr,
    stride_label,
    logprob_ptr,
    entropy_ptr,
    max_ptr,
    log2sum_ptr,
    vocab,
    scale,
    ignore_index,
    HAS_LABELS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Per row: entropy, max ``m`` and ``log2 S`` (kept for backward), and the label's log-prob."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_n
    lanes = tl.arange(0, BLOCK_V)
    m = tl.full((), LOWEST, tl.float32)
    s = tl.full((), 0.0, tl.float32)
    w = tl.full((), 0.0, tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + lanes
        inside = cols < vocab
        z = _bits(row_ptr, cols, inside, stride_v, scale)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        d = z - m_new
        e = tl.where(inside, tl.exp2(d), 0.0)  # lanes past the vocabulary count for nothing
        shift = m - m_new  # <= 0
        a = tl.exp2(shift)
        w = a * w + (a * shift) * s + tl.sum(e * d, axis=0)
        s = a * s + tl.sum(e, axis=0)
        m = m_new
    log2s = tl.log2(s)
    entropy = (log2s - w / s) * LN2
    entropy = tl.where(entropy < 0.0, 0.0, entropy)  # rounding may dip below 0
    tl.store(entropy_ptr + row, entropy)
    tl.store(max_ptr + row, m)
    tl.store(log2sum_ptr + row, log2s)
    if HAS_LABELS:
        label = tl.load(labels_ptr + row * stride_label).to(tl.int64)
        keep = label != ignore_index
        # A label outside [0, V) (and not ignore_index) reads nothing and gives NaN: checking it
        # on the host would synchronise.
        in_vocab = (label >= 0) & (label < vocab)
        x_y = tl.load(row_ptr + label * stride_v, mask=keep & in_vocab, other=float("nan"))
        z_y = x_y.to(tl.float32) * scale
        z_y = tl.where(z_y < LOWEST, LOWEST, z_y)
        logprob = ((z_y - m) - log2s) * LN2
        tl.store(logprob_ptr + row, tl.where(keep, logprob, 0.0))


@triton.jit
def logit_stats_backward(
    logits_ptr,
    stride_n,
    stride_v,
    grad_ptr,
    grad_stride_n,
    grad_stride_v,
    labels_ptr,
    stride_label,
    max_ptr,
    log2sum_ptr,
    entropy_ptr,
    grad_logprob_ptr,
    stride_grad_logprob,
    grad_entropy_ptr,
    stride_grad_entropy,
    vocab,
    scale,
    inv_temperature,
    ignore_index,
    HAS_GRAD_LOGPROB: tl.constexpr,
    HAS_GRAD_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Per row: the gradient with respect to the logits, written in ``grad_ptr``'s dtype."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_n
    grad_row_ptr = grad_ptr + row * grad_stride_n
    lanes = tl.arange(0, BLOCK_V)
    m = tl.load(max_ptr + row)
    log2s = tl.load(log2sum_ptr + row)
    if HAS_GRAD_LOGPROB:
        label = tl.load(labels_ptr + row * stride_label).to(tl.int64)
        keep = label != ignore_index
        g = tl.where(keep, tl.load(grad_logprob_ptr + row * stride_grad_logprob).to(tl.float32), 0.0)
        target = tl.where(keep, label, -1)  # an ignored token has no one-hot term (and g = 0)
    else:
        g = tl.full((), 0.0, tl.float32)
        target = tl.full((), -1, tl.int64)
    if HAS_GRAD_ENTROPY:
        g_entropy = tl.load(grad_entropy_ptr + row * stride_grad_entropy).to(tl.float32)
        entropy = tl.load(entropy_ptr + row)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + lanes
        inside = cols < vocab
        z = _bits(row_ptr, cols, inside, stride_v, scale)
        log2p = (z - m) - log2s
        p = tl.exp2(log2p)
        if HAS_GRAD_ENTROPY:
            log_p = tl.maximum(log2p * LN2, -1000.0)
            coef = g + g_entropy * (log_p + entropy)
        else:
            coef = g
        grad = (tl.where(cols == target, g, 0.0) - p * coef) * inv_temperature
        tl.store(
            grad_row_ptr + cols.to(tl.int64) * grad_stride_v,
            grad.to(grad_ptr.dtype.element_ty),
            mask=inside,
        )
