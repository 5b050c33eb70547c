"""[`token_stats`][rlstab.stats.token_stats] on a GPU: the LM head's matmuls at the card's half-precision rate,
the softmax passes by row kernels, both over chunks of the vocabulary.

The floor of ``token_stats`` with a trainable head is three matmuls of ``2 N V H`` FLOPs (the
logits, ``grad_h = G W``, ``grad_W = G^T h``); any path that never stores the ``[N, V]`` logits
adds a fourth, the logits recomputed in backward. Here the matmuls are cuBLAS's on the inputs'
own dtype with float32 accumulation, and float32 logits ([`half_matmul`][rlstab.stats.half_matmul]
says how each torch version gets them): bf16 at the tensor cores' rate, never converted to
float32 first on torch 2.8 and later. What is not a matmul, the softmax over each row, runs in the
row kernels of [`token_stats_from_logits`][rlstab.stats.token_stats_from_logits] (Triton; the CPU
path's torch passes where Triton is missing), one read of each float32 logit.

Both passes walk the vocabulary in chunks of ``cols`` entries, all tokens at once: every matmul is
``[N, H] x [H, cols]``, wide in all three dimensions for N of a few thousand, and the head is read
once per pass (chunks of tokens would re-read all of it per chunk: 38 times at N = 16,384 with
256 MiB chunks).

- Forward, per chunk: ``Z = h W_c^T`` (``[N, cols]`` float32), then the forward row kernel gives
  each token's chunk maximum ``m_c``, ``log2 S_c`` and chunk entropy ``H_c`` (the entropy of the
  softmax within the chunk), of ``Z / T`` in bits (the entropy in nats). After the last chunk, with
  ``L_c = m_c + log2 S_c`` and ``L = log2 sum_c 2^L_c``: ``H = sum_c 2^(L_c - L) (H_c + ln2 (L -
  L_c))`` (the entropy of a mixture of the chunks' softmaxes, every term nonnegative), and ``m =
  max_c m_c``, ``log2 S = L - m`` kept for backward. The label's logit is one dot product per
  token, ``h_i . W_{y_i}``, in float32 over blocks of tokens.
- Backward, over the tokens whose upstream gradient is not zero, per chunk: ``Z = h W_c^T``
  recomputed, the backward row kernel writes ``G = d/dZ`` (``(g onehot - p (g + gH (log p + H))) /
  T``, with ``p`` from the kept ``m`` and ``log2 S``) in the weight's dtype, then ``grad_W_c = G^T h``
  straight into the gradient, in the weight's dtype (the whole sum over tokens in one matmul,
  rounded once, as the model's own ``nn.Linear`` backward computes it), and ``grad_h += G W_c`` into
  a float32 ``[N, H]`` accumulator.

Working memory beyond the inputs and the returned gradients: one chunk of float32 logits (48 MiB,
or ``MIN_COLS`` columns beyond 6,144 tokens) and its ``G`` in the head's dtype (half that), and the
float32 ``[N, H]`` accumulator of ``grad_h`` (twice ``grad_h`` in bf16: the sums over chunks stay
float32); a few numbers per token and chunk. At H = 4,096 in bf16, measured on an H200: 0.133 GiB
at N = 4,096 (48 + 24 + 64 MiB; veRL's ``linear_cross_entropy`` 0.144) and 0.438 GiB at N = 16,384
(128 + 64 + 256 MiB; veRL's 0.578). ``G`` is rounded to the weight's dtype before the two backward
matmuls, as in every fused head (veRL's, Liger's).

Host reads: the backward reads the number of tokens with a nonzero upstream gradient once, to
skip the others (under a 20%-entropy mask, 80% of the work); nothing else.
"""

from __future__ import annotations

from rlstab.lazy import torch
from rlstab.stats._chunk import LN2, LOG2E, backward_chunk, forward_chunk
from rlstab.stats.half_matmul import Matmuls

CHUNK_BYTES = 48 << 20
"""Float32 logits per chunk, forward and backward: ``[N, cols]``, ``cols`` = 48 MiB / (4 N), at least ``MIN_COLS``."""

MIN_COLS = 2048
"""Vocabulary entries per chunk at least: above 6,144 tokens a chunk grows with N instead of thinning (at
N = 16,384, H = 4,096 on an H200: 2,048 columns 139 ms, 1,024 columns 148 ms; the chunk is then half the
float32 ``[N, H]`` accumulator the backward holds anyway). ``benchmarks/lm_head_chunks.py`` measures it."""

COL_MULTIPLE = 128
"""Chunks are multiples of this many vocabulary entries (tensor-core friendly), but the last."""

_NEVER = -(1 << 62)
"""An ignore_index no label can equal: the backward passes labels relative to a vocabulary chunk."""


class _RowOps:
    """The softmax passes over float32 logit rows: ``forward(z) -> (entropy, m, log2 S)``, float32 ``[rows]`` (``m``
    and ``log2 S`` in bits), and ``backward(z, labels, m, log2s, entropy, g, g_entropy, out)`` writing ``G`` in ``out``."""

    def __init__(self, use_triton: bool, temperature: float):
        self.triton = use_triton
        self.temperature = temperature
        if use_triton:
            from rlstab.stats.triton import function

            self._kernels = function

    def forward(self, z):
        if self.triton:
            _, entropy, m, log2s = self._kernels.forward(z, None, self.temperature, 0)
            return entropy, m, log2s
        z.mul_(LOG2E / self.temperature)  # in bits (see _chunk); z is scratch
        m = z.amax(-1)
        first = torch.zeros(z.shape[0], dtype=torch.int64, device=z.device)  # a label forward_chunk needs; unused
        _, _, entropy, total = forward_chunk(z, first, torch.empty_like(z))
        return entropy, m, total.log2()

    def backward(self, z, labels, m, log2s, entropy, g, g_entropy, out):
        """``labels`` relative to the chunk's first column (out of ``[0, cols)``: no one-hot term there)."""
        if self.triton:
            return self._kernels.backward(
                z, labels, m, log2s, entropy, g, g_entropy, self.temperature, _NEVER, out=out
            )
        cols = z.shape[1]
        inside = (labels >= 0) & (labels < cols)
        z.mul_(LOG2E / self.temperature)
        lse = (m + log2s) / LOG2E  # in nats, as backward_chunk takes it
        backward_chunk(
            z, labels.clamp(0, max(cols - 1, 0)), lse, g, entropy if g_entropy is not None else None, g_entropy,
            torch.empty_like(z) if g_entropy is not None else None, grad_label=g * inside,
        )
        if self.temperature != 1.0:
            z.div_(self.temperature)
        out.copy_(z)
        return out


def _cols(rows: int, vocab: int, chunk_bytes: int) -> int:
    """Vocabulary entries per chunk: ``chunk_bytes`` of float32 logits of ``rows`` tokens in multiples of
    ``COL_MULTIPLE``, at least ``MIN_COLS``."""
    return min(vocab, max(MIN_COLS, chunk_bytes // (4 * max(rows, 1)) // COL_MULTIPLE * COL_MULTIPLE))


def _chunks(vocab: int, cols: int):
    return ((v0, min(v0 + cols, vocab)) for v0 in range(0, vocab, cols))


def merge_chunks(entropy, m, log2s):
    """``(entropy, m, log2 S)`` of each token's whole softmax from its chunks' ``[C, N]`` ones (module docstring)."""
    top = m.amax(0)
    whole = torch.exp2(m + log2s - top).sum(0).log2()  # log2 S of the whole row, relative to its maximum
    share = m + log2s - (top + whole)  # L_c - L <= 0: log2 of each chunk's share of the probability
    mixed = (torch.exp2(share) * (entropy - LN2 * share)).sum(0).clamp_(min=0.0)
    return mixed, top, whole


def label_logprob(hidden, weight, labels, m, log2s, temperature: float, ignore_index: int, chunk_bytes: int):
    """``log p(y)`` of each token, 0 where ignored: its logit ``h_i . W_{y_i}`` in float32, less the kept log-sum-exp."""
    n, width = hidden.shape
    keep = labels != ignore_index
    rows_of_w = torch.where(keep, labels, 0)
    logit = torch.empty(n, dtype=torch.float32, device=hidden.device)
    rows = max(1, chunk_bytes // (8 * width))  # two float32 [rows, H] operands per block
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        picked = weight[rows_of_w[r0:r1]].to(torch.float32)
        torch.linalg.vecdot(hidden[r0:r1].to(torch.float32), picked, out=logit[r0:r1])
    logprob = logit.mul_(LOG2E / temperature).sub_(m).sub_(log2s).mul_(LN2).clamp_(max=0.0)
    return torch.where(keep, logprob, 0.0)


def forward(hidden, weight, labels, ops: _RowOps, ignore_index: int, chunk_bytes: int = CHUNK_BYTES):
    """``(logprob, entropy, m, log2 S)``, float32 ``[N]`` each, for ``[N, H]`` hidden states."""
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    if n == 0:
        return tuple(torch.empty(0, dtype=torch.float32, device=device) for _ in range(4))
    mats = Matmuls(weight.dtype, device)
    cols = _cols(n, vocab, chunk_bytes)
    z = torch.empty(n * cols, dtype=torch.float32, device=device)
    h = mats.operand(hidden)
    parts = []
    for v0, v1 in _chunks(vocab, cols):
        logits = mats.mm(h, mats.operand(weight[v0:v1]).t(), out=z[: n * (v1 - v0)].view(n, v1 - v0))
        parts.append(ops.forward(logits))
    del z, h
    entropy, m, log2s = merge_chunks(*(torch.stack(part) for part in zip(*parts)))
    logprob = label_logprob(hidden, weight, labels, m, log2s, ops.temperature, ignore_index, chunk_bytes)
    return logprob, entropy, m, log2s


def backward(hidden, weight, labels, m, log2s, entropy, g, g_entropy, ops: _RowOps, need_h: bool, need_w: bool,
             chunk_bytes: int = CHUNK_BYTES):
    """``(grad_h, grad_W)`` in the hidden states' and the weight's dtypes (None where not needed), ``[N, H]`` hidden.

    ``g`` is 0 on ignored tokens. Tokens whose upstream gradients are all zero contribute nothing and are
    left out (their ``grad_h`` rows are 0).
    """
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    active = g != 0 if g_entropy is None else (g != 0) | (g_entropy != 0)
    index = active.nonzero().view(-1)  # host sync: how many tokens carry a gradient (the work to do)
    k = index.numel()
    if k == 0:
        return (torch.zeros_like(hidden) if need_h else None), (torch.zeros_like(weight) if need_w else None)
    every = hidden
    if k < n:
        hidden, labels, m, log2s, entropy, g = (x[index] for x in (hidden, labels, m, log2s, entropy, g))
        g_entropy = None if g_entropy is None else g_entropy[index]
    mats = Matmuls(weight.dtype, device)
    grad_w = torch.empty_like(weight) if need_w else None  # every chunk writes its rows
    acc = torch.zeros(k, hidden.shape[1], dtype=torch.float32, device=device) if need_h else None
    cols = _cols(k, vocab, chunk_bytes)
    z = torch.empty(k * cols, dtype=torch.float32, device=device)
    grad_logits = torch.empty(k * cols, dtype=weight.dtype, device=device)  # G in the head's dtype
    h = mats.operand(hidden)
    for v0, v1 in _chunks(vocab, cols):
        w = mats.operand(weight[v0:v1])
        logits = mats.mm(h, w.t(), out=z[: k * (v1 - v0)].view(k, v1 - v0))
        G = ops.backward(logits, labels - v0, m, log2s, entropy, g, g_entropy,
                         grad_logits[: k * (v1 - v0)].view(k, v1 - v0))
        if need_w:
            torch.mm(G.t(), hidden, out=grad_w[v0:v1])  # in the head's dtype; the matmul sums in float32
        if need_h:
            mats.add_mm(acc, mats.operand(G), w)
    del z, grad_logits, h
    if not need_h:
        return None, grad_w
    if k == n:
        return acc.to(every.dtype), grad_w
    return torch.zeros_like(every).index_copy_(0, index, acc.to(every.dtype)), grad_w


class HeadStats(torch.autograd.Function):
    """``(logprob, entropy)`` of ``softmax(h W^T / T)`` by the GPU path; gradients to ``h`` and ``W``."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, entropy_grad, ignore_index, use_triton, chunk_bytes):
        ops = _RowOps(use_triton, temperature)
        with torch.no_grad():
            logprob, entropy, m, log2s = forward(hidden, weight, labels, ops, ignore_index, chunk_bytes)
        ctx.save_for_backward(hidden, weight, labels, m, log2s, entropy)
        ctx.settings = temperature, entropy_grad, ignore_index, use_triton, chunk_bytes
        ctx.set_materialize_grads(False)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        hidden, weight, labels, m, log2s, entropy = ctx.saved_tensors
        temperature, entropy_grad, ignore_index, use_triton, chunk_bytes = ctx.settings
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g_entropy = grad_entropy.to(torch.float32) if (entropy_grad and grad_entropy is not None) else None
        if grad_logprob is None and g_entropy is None:
            return (None,) * 8
        g = torch.zeros_like(m) if grad_logprob is None else grad_logprob.to(torch.float32)
        g = torch.where(labels != ignore_index, g, 0.0)  # an ignored token's log-prob is the constant 0
        with torch.no_grad():
            grad_h, grad_w = backward(hidden, weight, labels, m, log2s, entropy, g, g_entropy,
                                      _RowOps(use_triton, temperature), need_h, need_w, chunk_bytes)
        return (grad_h if need_h else None, grad_w if need_w else None) + (None,) * 6


def token_stats_gpu(hidden, weight, labels, *, temperature, entropy_grad, ignore_index, use_triton,
                    chunk_bytes: int = CHUNK_BYTES):
    """``token_stats`` by the GPU path on ``[N, H]`` hidden states and ``[N]`` labels (already flat)."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return HeadStats.apply(hidden, weight, labels, float(temperature), entropy_grad, ignore_index, use_triton,
                               chunk_bytes)
    with torch.no_grad():
        logprob, entropy, _, _ = forward(hidden, weight, labels, _RowOps(use_triton, float(temperature)),
                                         ignore_index, chunk_bytes)
    return logprob, entropy
