"""Launches of the kernels and the autograd Function of the Triton path (see ``kernels``).

Tiles, for an H100 (chosen, not timed: ``benchmarks/gpu.py`` times them): one program per token,
``BLOCK_V = 4096`` logits per tile and 8 warps. A tile is then 16 logits per thread (two 16-byte
loads of bf16, four of float32) and a row of 151,936 logits takes 38 tiles, the last one ragged.
Compiled for sm_90 (``ptxas``), both kernels use 30 to 40 registers a thread and spill nothing,
so six to eight programs fit on an SM: enough loads in flight to stream the logits at memory speed,
while the three reductions of a tile (a max, two sums) are amortised over 4096 logits. Loads and
stores are 16-byte vectors when the vocabulary is a multiple of 16 (Triton then knows each row
aligned), scalar otherwise. Thousands of tokens per micro-batch fill the grid; a handful of tokens
(fewer than the 132 SMs) leave the card partly idle, but then the whole call takes microseconds.

No host synchronisation: shapes and strides are all the launch needs; ignored and out-of-range
labels are handled inside the kernels.
"""

from __future__ import annotations

import contextlib

import triton

from rlstab.lazy import torch
from rlstab.stats._chunk import LOG2E
from rlstab.stats.arguments import check_logits_arguments
from rlstab.stats.triton.kernels import logit_stats_backward, logit_stats_forward

BLOCK_V = 4096
"""Logits per tile (a power of 2): 8 KiB of bf16, 16 per thread at 8 warps."""
NUM_WARPS = 8
"""Warps per program at ``BLOCK_V``; fewer for the smaller tiles of a small vocabulary."""


def dtypes() -> tuple[torch.dtype, ...]:
    """The logits' dtypes the kernels take (float64 stays on the exact torch path)."""
    return (torch.float16, torch.bfloat16, torch.float32)


def _tile(vocab: int, block_v: int | None) -> tuple[int, int]:
    """``(BLOCK_V, num_warps)``: no tile wider than the vocabulary needs, 512 logits per warp at most."""
    block = min(block_v or BLOCK_V, triton.next_power_of_2(max(vocab, 1)))
    block = max(block, 16)
    return block, max(1, min(NUM_WARPS, block // 512))


def _on_device(tensor: torch.Tensor):
    """Launch on the logits' own card (Triton launches on the current one)."""
    return torch.cuda.device(tensor.device) if tensor.device.type == "cuda" else contextlib.nullcontext()


def forward(logits, labels, temperature: float, ignore_index: int, block_v: int | None = None):
    """``(logprob or None, entropy, m, log2 S)``, float32 ``[N]`` each, of ``[N, V]`` ``logits``."""
    n, vocab = logits.shape
    device = logits.device
    entropy = torch.empty(n, dtype=torch.float32, device=device)
    row_max, log2sum = torch.empty_like(entropy), torch.empty_like(entropy)
    logprob = None if labels is None else torch.empty_like(entropy)
    if n == 0:
        return logprob, entropy, row_max, log2sum
    block, warps = _tile(vocab, block_v)
    with _on_device(logits):
        logit_stats_forward[(n,)](
            logits,
            logits.stride(0),
            logits.stride(1),
            entropy if labels is None else labels,  # a stand-in pointer, never read without labels
            0 if labels is None else labels.stride(0),
            entropy if logprob is None else logprob,
            entropy,
            row_max,
            log2sum,
            vocab,
            LOG2E / temperature,
            ignore_index,
            HAS_LABELS=labels is not None,
            BLOCK_V=block,
            num_warps=warps,
        )
    return logprob, entropy, row_max, log2sum


def backward(
    logits, labels, row_max, log2sum, entropy, grad_logprob, grad_entropy,
    temperature: float, ignore_index: int, block_v: int | None = None, out=None,
):
    """The gradient with respect to ``logits`` of ``logprob`` and ``entropy``: in ``out`` (any dtype and
    strides, shaped like ``logits``), or in a new tensor like ``logits``."""
    grad = torch.empty_like(logits) if out is None else out
    n, vocab = logits.shape
    if n == 0:
        return grad
    block, warps = _tile(vocab, block_v)
    has_g, has_gh = grad_logprob is not None, grad_entropy is not None
    with _on_device(logits):
        logit_stats_backward[(n,)](
            logits,
            logits.stride(0),
            logits.stride(1),
            grad,
            grad.stride(0),
            grad.stride(1),
            labels if has_g else entropy,
            labels.stride(0) if has_g else 0,
            row_max,
            log2sum,
            entropy,
            grad_logprob if has_g else entropy,
            grad_logprob.stride(0) if has_g else 0,
            grad_entropy if has_gh else entropy,
            grad_entropy.stride(0) if has_gh else 0,
            vocab,
            LOG2E / temperature,
            1.0 / temperature,
            ignore_index,
            HAS_GRAD_LOGPROB=has_g,
            HAS_GRAD_ENTROPY=has_gh,
            BLOCK_V=block,
            num_warps=warps,
        )
    return grad


class _TritonLogitStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, entropy_grad, ignore_index, block_v):
        logprob, entropy, row_max, log2sum = forward(logits, labels, temperature, ignore_index, block_v)
        ctx.save_for_backward(logits, labels, row_max, log2sum, entropy)
        ctx.temperature, ctx.entropy_grad = temperature, entropy_grad
        ctx.ignore_index, ctx.block_v = ignore_index, block_v
        ctx.set_materialize_grads(False)  # a missing gradient is None, and its terms are skipped
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        logits, labels, row_max, log2sum, entropy = ctx.saved_tensors
        g = grad_logprob if labels is not None else None
        g_entropy = grad_entropy if ctx.entropy_grad else None
        if g is None and g_entropy is None:
            return None, None, None, None, None, None
        grad = backward(
            logits, labels, row_max, log2sum, entropy, g, g_entropy,
            ctx.temperature, ctx.ignore_index, ctx.block_v,
        )
        return grad, None, None, None, None, None


def token_stats_from_logits_triton(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
    ignore_index: int = -100,
    block_v: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``token_stats_from_logits`` by the Triton kernels, on whatever tensors it is given.

    Same arguments and results as ``rlstab.stats.token_stats_from_logits`` (which calls it for CUDA
    tensors), with these differences: ``chunk_size`` is checked and ignored (there are no chunks:
    one program per token); a label outside ``[0, V)`` that is not ``ignore_index`` gives a NaN
    log-probability instead of an error (checking would synchronise); float64 logits are refused
    (the torch path computes them exactly); a row whose logits are all ``-inf`` is uniform, as on
    the CPU path, and its gradient is the uniform distribution's (the CPU path's backward takes
    ``p = 0`` there: its log-sum-exp, kept in nats, rounds at the lowest float). ``block_v`` (a
    power of 2) overrides the tile width, for tests. CPU tensors run only under Triton's
    interpreter (``TRITON_INTERPRET=1``).
    """
    check_logits_arguments(logits, labels, temperature, chunk_size)
    if logits.dtype not in dtypes():
        raise TypeError(f"the Triton path takes float16, bfloat16 or float32 logits, got {logits.dtype}")
    if labels is not None and labels.device != logits.device:
        raise ValueError(f"labels are on {labels.device}, logits on {logits.device}")
    if logits.shape[-1] == 0:
        raise ValueError("logits have an empty vocabulary (last dimension 0)")
    if block_v is not None and (block_v < 1 or block_v & (block_v - 1)):
        raise ValueError(f"block_v must be a power of 2, got {block_v}")
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    y = None if labels is None else labels.reshape(-1)
    temperature = float(temperature)
    needs_graph = torch.is_grad_enabled() and logits.requires_grad and (labels is not None or entropy_grad)
    if needs_graph:
        logprob, entropy = _TritonLogitStats.apply(flat, y, temperature, entropy_grad, int(ignore_index), block_v)
    else:
        with torch.no_grad():
            logprob, entropy = forward(flat, y, temperature, int(ignore_index), block_v)[:2]
    return (None if logprob is None else logprob.view(shape)), entropy.view(shape)
