"""[`token_stats`][rlstab.stats.token_stats] on a GPU: the LM head's matmuls at the card's half-precision rate,
the softmax passes by row kernels over GPU-sized chunks of logits.

The floor of ``token_stats`` with a trainable head is three matmuls of ``2 N V H`` FLOPs (the
logits, ``grad_h = G W``, ``grad_W = G^T h``); any path that never stores the ``[N, V]`` logits
adds a fourth, the logits recomputed in backward. Here the four matmuls are cuBLAS's, on the
inputs' own dtype with float32 accumulation and float32 output (``torch.mm(..., out_dtype=
torch.float32)``): bf16 at the tensor cores' rate, never converted to float32 first (a float32
matmul is 15 times slower on an H100). What is not a matmul, the softmax over each row, runs in
the row kernels of [`token_stats_from_logits`][rlstab.stats.token_stats_from_logits] (Triton;
the CPU path's torch passes where Triton is missing), one read of each float32 logit.

- Forward, per chunk of ``rows`` tokens: ``Z = h_c W^T`` (``[rows, V]`` float32), then the forward
  row kernel: per token, the running maximum ``m`` and ``log2 S`` (kept for backward), the entropy
  and the label's log-probability, all of ``Z / T``.
- Backward, over the tokens whose upstream gradient is not zero, per chunk of ``cols`` vocabulary
  entries: ``Z = h W_c^T`` recomputed, the backward row kernel writes ``G = d/dZ`` (``(g onehot -
  p (g + gH (log p + H))) / T``, with ``p`` from the kept ``m`` and ``log2 S``) in the weight's
  dtype, then ``grad_W_c = G^T h`` (the whole sum over tokens in one matmul: no float32
  ``[V, H]`` accumulator) and ``grad_h += G W_c`` (a float32 ``[N, H]`` accumulator).

Chunks are sized to ``CHUNK_BYTES`` of float32 logits whatever N and V (plus ``G`` in the head's
dtype); beyond them the backward holds the float32 ``[N, H]`` accumulator of ``grad_h`` and one
chunk's float32 ``grad_W`` rows. ``G`` is rounded to the weight's dtype before the two backward
matmuls, as in every fused head (veRL's, Liger's); their sums over tokens and over the vocabulary
accumulate in float32.

Host reads: the backward reads the number of tokens with a nonzero upstream gradient once, to
skip the others (under a 20%-entropy mask, 80% of the work); nothing else.
"""

from __future__ import annotations

from rlstab.lazy import torch
from rlstab.stats._chunk import LOG2E, backward_chunk, forward_chunk

CHUNK_BYTES = 256 << 20
"""Float32 logits per chunk, forward and backward (256 MiB: 441 tokens x 151,936 entries)."""

MIN_COLS = 128
"""The backward's vocabulary chunks are multiples of this (tensor-core friendly), and at least this wide."""

_NEVER = -(1 << 62)
"""An ignore_index no label can equal: the backward passes labels relative to a vocabulary chunk."""


def matmul_f32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, add: bool = False) -> torch.Tensor:
    """``a @ b`` (``+ out`` when ``add``) in float32: on CUDA half-precision inputs, cuBLAS at their rate with
    float32 output; elsewhere (CPU tensors, float32 inputs) the same numbers by a float32 matmul."""
    if a.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
        if add:
            try:  # cuBLAS's beta = 1: the float32 accumulator is read and written in place
                return torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
            except RuntimeError:  # a torch whose addmm takes no out_dtype: one more [rows, H] float32 temporary
                return out.add_(torch.mm(a, b, out_dtype=torch.float32))
        return torch.mm(a, b, out_dtype=torch.float32, out=out) if out is not None else torch.mm(a, b, out_dtype=torch.float32)
    a, b = a.to(torch.float32), b.to(torch.float32)
    if add:
        return out.addmm_(a, b)
    return torch.mm(a, b, out=out) if out is not None else torch.mm(a, b)


class _RowOps:
    """The softmax passes over float32 logit rows: ``forward(z, labels) -> (logprob, entropy, m, log2 S)`` in
    float32 ``[rows]``, and ``backward(z, labels, m, log2s, entropy, g, g_entropy, out)`` writing ``G`` in ``out``."""

    def __init__(self, use_triton: bool, temperature: float):
        self.triton = use_triton
        self.temperature = temperature
        if use_triton:
            from rlstab.stats.triton import function

            self._kernels = function

    def forward(self, z, labels, ignore_index):
        if self.triton:
            logprob, entropy, m, log2s = self._kernels.forward(z, labels, self.temperature, ignore_index)
            return logprob, entropy, m, log2s
        keep = labels != ignore_index
        y = torch.where(keep, labels, 0)
        z.mul_(LOG2E / self.temperature)  # in bits (see _chunk); z is scratch
        m = z.amax(-1)
        _, logprob, entropy, total = forward_chunk(z, y, torch.empty_like(z))
        return torch.where(keep, logprob, 0.0), entropy, m, total.log2()

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


def _rows_per_chunk(width: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, width * 4))


def forward(hidden, weight, labels, ops: _RowOps, ignore_index: int, chunk_bytes: int = CHUNK_BYTES):
    """``(logprob, entropy, m, log2 S)``, float32 ``[N]`` each, for ``[N, H]`` hidden states."""
    n, vocab = hidden.shape[0], weight.shape[0]
    out = [torch.empty(n, dtype=torch.float32, device=hidden.device) for _ in range(4)]
    rows = _rows_per_chunk(vocab, chunk_bytes)
    z = torch.empty(min(rows, n) * vocab, dtype=torch.float32, device=hidden.device)
    wt = weight.t()
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        logits = matmul_f32(hidden[start:stop], wt, out=z[: (stop - start) * vocab].view(stop - start, vocab))
        for buf, part in zip(out, ops.forward(logits, labels[start:stop], ignore_index)):
            buf[start:stop] = part
    return tuple(out)


def backward(hidden, weight, labels, m, log2s, entropy, g, g_entropy, ops: _RowOps, need_h: bool, need_w: bool,
             chunk_bytes: int = CHUNK_BYTES):
    """``(grad_h, grad_W)`` (float32 and the weight's dtype; None where not needed) over ``[N, H]`` hidden states.

    ``g`` is 0 on ignored tokens. Tokens whose upstream gradients are all zero contribute nothing and are
    left out (their ``grad_h`` rows are 0).
    """
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    active = g != 0 if g_entropy is None else (g != 0) | (g_entropy != 0)
    index = active.nonzero().view(-1)  # host sync: how many tokens carry a gradient (the work to do)
    grad_w = torch.zeros_like(weight) if need_w else None
    k = index.numel()
    if k == 0:
        return (torch.zeros(n, hidden.shape[1], dtype=torch.float32, device=device) if need_h else None), grad_w
    if k < n:
        hidden, labels, m, log2s, entropy, g = (x[index] for x in (hidden, labels, m, log2s, entropy, g))
        g_entropy = None if g_entropy is None else g_entropy[index]
    acc = torch.zeros(k, hidden.shape[1], dtype=torch.float32, device=device) if need_h else None
    cols = min(vocab, max(MIN_COLS, _rows_per_chunk(k, chunk_bytes) // MIN_COLS * MIN_COLS))
    z = torch.empty(k * cols, dtype=torch.float32, device=device)
    grad_logits = torch.empty(k * cols, dtype=weight.dtype, device=device)  # G in the head's dtype
    for v0 in range(0, vocab, cols):
        v1 = min(v0 + cols, vocab)
        w = weight[v0:v1]
        logits = matmul_f32(hidden, w.t(), out=z[: k * (v1 - v0)].view(k, v1 - v0))
        G = ops.backward(logits, labels - v0, m, log2s, entropy, g, g_entropy,
                         grad_logits[: k * (v1 - v0)].view(k, v1 - v0))
        if need_w:
            grad_w[v0:v1] = matmul_f32(G.t(), hidden)
        if need_h:
            matmul_f32(G, w, out=acc, add=True)
    grad_h = None
    if need_h:
        grad_h = acc if k == n else acc.new_zeros(n, acc.shape[1]).index_copy_(0, index, acc)
    return grad_h, grad_w


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
        return (grad_h.to(hidden.dtype) if need_h else None, grad_w if need_w else None) + (None,) * 6


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
