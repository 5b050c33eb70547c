"""Per-token log-probabilities and entropy from logits a trainer already has, in one pass.

When the trainer's model returns the ``[..., V]`` logits anyway, the cost left is what the usual
code does with them: ``log_softmax`` writes a second ``[..., V]`` tensor (and keeps it for
backward), the entropy writes a softmax and a product of that size, and the backward writes a
zero tensor for the gather and another for the log-softmax gradient.
[`token_stats_from_logits`][rlstab.stats.token_stats_from_logits] keeps only a few numbers per
token, and in backward writes the gradient straight into the one ``[..., V]`` tensor autograd
needs. Where it runs:

- CUDA logits (float16, bfloat16, float32) with Triton installed: fused Triton kernels
  (``rlstab.stats.triton``), one program per token, one read of its logits in forward, one read
  and one write of the gradient in backward.
- CPU logits, float64 logits, or CUDA without Triton: torch, chunk by chunk of tokens through a
  float32 buffer (about 16 MiB on CPU, to stay in the cache; 256 MiB on a GPU). The CPU path is
  the reference the kernels are tested against.
"""

from __future__ import annotations

from rlstab.lazy import torch
from rlstab.stats._chunk import LOG2E, _compute_dtype, backward_chunk, forward_chunk
from rlstab.stats.arguments import check_logits_arguments as _check_arguments
from rlstab.stats.backend import on_gpu
from rlstab.stats.backend import triton_imports as _triton_imports

CHUNK_BYTES = 16 << 20
"""Target size of one chunk's float32 buffer on CPU; ``chunk_size=None`` picks the rows from it."""

GPU_CHUNK_BYTES = 256 << 20
"""Target size of one chunk's float32 buffer on a GPU, where the torch path runs without Triton."""


def default_chunk_rows(vocab: int, itemsize: int = 4, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk so that a chunk of logits takes about ``chunk_bytes`` in the compute dtype.

    Why ``CHUNK_BYTES`` on CPU: the chunk's half a dozen passes (copy, max, exp, sums) then run on
    memory that stays in the last-level cache, while the logits themselves are read from memory
    once. On a GPU (``GPU_CHUNK_BYTES``) each pass is a kernel launch, and a chunk must hold enough
    tokens to fill the card.
    """
    return max(1, chunk_bytes // max(1, vocab * itemsize))


def runs_fused(logits) -> bool:
    """Whether [`token_stats_from_logits`][rlstab.stats.token_stats_from_logits] runs the fused
    Triton kernels for these logits (CUDA, float16/bfloat16/float32, Triton installed).

    Adapters ask it to keep the trainer's own function where rlstab would run its torch path on a
    GPU, which is slower than the trainers' (``docs/gpu.md``). The device is looked at first, so
    that CPU tensors never import Triton.
    """
    return _use_triton(logits)


def _use_triton(logits) -> bool:
    """CUDA logits of a dtype the kernels take, with Triton installed: the Triton path.

    The device is looked at first, so that CPU tensors never import Triton.
    """
    return on_gpu(logits) and _triton_imports()


def _load(z: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``z <- max(log2(e) * logits / T, lowest float)`` in z's dtype (logits in bits, see ``_chunk``).

    ``-inf`` logits (a masked vocabulary) become the lowest finite float, so that their
    probability is exactly 0 and ``0 * log 0`` terms vanish instead of making NaN.
    """
    scale = LOG2E / temperature
    if logits.dtype == z.dtype:
        torch.mul(logits, scale, out=z)
    else:
        z.copy_(logits).mul_(scale)
    return z.clamp_(min=torch.finfo(z.dtype).min)


@torch.no_grad()
def _forward(logits, labels, valid, temperature, chunk):
    n, dtype = logits.shape[0], _compute_dtype(logits)
    lse = torch.empty(n, dtype=dtype, device=logits.device)
    logprob, entropy = torch.empty_like(lse), torch.empty_like(lse)
    rows = min(chunk, n)
    z_buf = torch.empty(rows, logits.shape[1], dtype=dtype, device=logits.device)
    e_buf = torch.empty_like(z_buf)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        z = _load(z_buf[: stop - start], logits[start:stop], temperature)
        lse[start:stop], logprob[start:stop], entropy[start:stop], _ = forward_chunk(
            z, labels[start:stop], e_buf[: stop - start]
        )
    logprob.mul_(valid)
    return lse, logprob, entropy


class _LogitStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, valid, temperature, chunk, entropy_grad):
        lse, logprob, entropy = _forward(logits, labels, valid, temperature, chunk)
        ctx.save_for_backward(logits, labels, valid, lse, entropy)
        ctx.temperature, ctx.chunk, ctx.entropy_grad = temperature, chunk, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        logits, labels, valid, lse, entropy = ctx.saved_tensors
        dtype, n = lse.dtype, logits.shape[0]
        g = torch.zeros(n, dtype=dtype, device=logits.device) if grad_logprob is None else grad_logprob.to(dtype)
        g = g * valid
        g_ent = grad_entropy.to(dtype) if (ctx.entropy_grad and grad_entropy is not None) else None
        grad = torch.empty_like(logits)
        # Same dtype: the chunk's gradient is computed in the output's own memory, no buffer.
        direct = logits.dtype == dtype
        rows = min(ctx.chunk, n)
        z_buf = None if direct else torch.empty(rows, logits.shape[1], dtype=dtype, device=logits.device)
        e_buf = torch.empty(rows, logits.shape[1], dtype=dtype, device=logits.device) if g_ent is not None else None
        for start in range(0, n, ctx.chunk):
            stop = min(start + ctx.chunk, n)
            sl = slice(start, stop)
            z = _load(grad[sl] if direct else z_buf[: stop - start], logits[sl], ctx.temperature)
            backward_chunk(
                z, labels[sl], lse[sl], g[sl],
                entropy[sl] if g_ent is not None else None,
                g_ent[sl] if g_ent is not None else None,
                e_buf[: stop - start] if g_ent is not None else None,
            )
            if ctx.temperature != 1.0:
                z.div_(ctx.temperature)  # d/dlogits = (d/d(logits / T)) / T
            if not direct:
                grad[sl].copy_(z)
        return grad, None, None, None, None, None


def token_stats_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
    ignore_index: int = -100,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Log-probability of each label and entropy of each distribution ``softmax(logits / temperature)``.

    Args:
        logits: ``[..., V]`` (any float dtype; computed in float32, float64 for float64 input).
            ``-inf`` entries (masked tokens) have probability 0.
        labels: ``[...]`` (``logits.shape[:-1]``) token ids, or None for the entropy alone.
            ``ignore_index`` marks tokens without a label (log-probability 0, no gradient).
        temperature: the logits are divided by it (> 0), as trainers do before ``log_softmax``.
        chunk_size: tokens per chunk of the torch path; None: about 16 MiB of float32 logits per
            chunk on CPU, 256 MiB on a GPU (``default_chunk_rows``). Ignored by the Triton path,
            which has no chunks.
        entropy_grad: give the entropy a gradient (entropy bonus); detached by default.
        ignore_index: the label value of tokens without a label.

    Returns:
        ``(logprobs, entropy)`` of ``labels``' shape in float32 (``logprobs`` None without
        labels). ``logprobs`` carries the gradient to ``logits``.

    Where it runs: CUDA logits in float16, bfloat16 or float32 go to fused Triton kernels when
    Triton is installed (one read of the logits in forward, one read and one write of the
    gradient in backward, no host synchronisation; there a label outside ``[0, V)`` gives a NaN
    log-probability rather than an error). Everything else (CPU, float64, CUDA without Triton)
    runs the chunked torch path, the reference. Both compute the same formulas, in float32
    (float64 for float64 logits, on the torch path).
    """
    _check_arguments(logits, labels, temperature, chunk_size)
    if _use_triton(logits):
        from rlstab.stats.triton import token_stats_from_logits_triton

        return token_stats_from_logits_triton(
            logits, labels, temperature=temperature, entropy_grad=entropy_grad, ignore_index=ignore_index
        )
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    dtype = _compute_dtype(logits)
    if labels is None:
        y = torch.zeros(flat.shape[0], dtype=torch.int64, device=logits.device)
        valid = torch.zeros(flat.shape[0], dtype=dtype, device=logits.device)
    else:
        y = labels.reshape(-1)
        keep = y != ignore_index
        y = torch.where(keep, y, torch.zeros((), dtype=y.dtype, device=y.device)).to(torch.int64)
        valid = keep.to(dtype)
    chunk = chunk_size or default_chunk_rows(
        logits.shape[-1], torch.finfo(dtype).bits // 8, CHUNK_BYTES if logits.device.type == "cpu" else GPU_CHUNK_BYTES
    )
    temperature = float(temperature)
    needs_graph = torch.is_grad_enabled() and logits.requires_grad and (labels is not None or entropy_grad)
    if needs_graph:
        logprob, entropy = _LogitStats.apply(flat, y, valid, temperature, chunk, entropy_grad)
    else:
        _, logprob, entropy = _forward(flat, y, valid, temperature, chunk)
    return (None if labels is None else logprob.view(shape)), entropy.view(shape)
