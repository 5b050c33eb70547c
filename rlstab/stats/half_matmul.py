"""Matrix products of half-precision operands with float32 results, by whatever the installed torch offers.

The LM head's GPU path ([`lm_head_gpu`][rlstab.stats.lm_head_gpu]) multiplies bf16 or fp16 hidden
states and weights and needs float32 logits: rounding the logits to bf16 costs up to 0.03 nats of
log-probability. Three branches, chosen by what torch accepts (feature detection, never the
version string), probed once per device type and dtype on 2 x 2 tensors:

- ``FUSED`` (torch 2.10 and later on CUDA): ``torch.mm(a, b, out_dtype=torch.float32)`` and
  ``torch.addmm(acc, a, b, out_dtype=torch.float32)``: cuBLAS at the tensor cores' half-precision
  rate, float32 accumulation and output, and the float32 accumulator read and written in place.
- ``MM_ONLY`` (torch 2.8 and 2.9, whose ``addmm`` rejects a float32 ``self`` with half-precision
  operands): the same ``mm``; an accumulation adds the product from a float32 temporary the size of
  the accumulator (``[N, H]`` in the LM head's backward).
- ``UPCAST`` (torch 2.7 and older: ``out_dtype`` is not an argument, ``TypeError``; and builds that do
  not implement it, such as the CPU one): the operands converted to float32, a chunk at a time by the
  caller, and multiplied with TF32 allowed on CUDA. TF32 keeps 10 bits of mantissa, so bf16 (7 bits)
  and fp16 (10 bits) operands are held exactly: the same products and float32 sums as ``FUSED``, at
  the TF32 rate (about half the bf16 rate on an H100) plus the conversions.

Float32 operands take a plain float32 ``mm`` in every branch (TF32 as the user set it).
"""

from __future__ import annotations

import contextlib
import functools

from rlstab.lazy import torch

FUSED, MM_ONLY, UPCAST = "fused", "mm_only", "upcast"


@functools.cache
def branch(device_type: str, dtype: torch.dtype) -> str:
    """Which of ``FUSED``, ``MM_ONLY``, ``UPCAST`` this torch takes for ``dtype`` operands on ``device_type``."""
    if dtype not in (torch.float16, torch.bfloat16):
        return UPCAST  # float32 (or float64) operands: a plain matmul is already what is wanted
    # The calls below as the LM head makes them: into an ``out`` tensor, and in place into the accumulator.
    a = torch.ones(2, 2, dtype=dtype, device=device_type)
    product = torch.empty(2, 2, dtype=torch.float32, device=device_type)
    try:
        torch.mm(a, a, out_dtype=torch.float32, out=product)
    except (TypeError, RuntimeError, NotImplementedError):  # no such argument (torch <= 2.7), or not built here
        return UPCAST
    try:
        torch.addmm(product, a, a, out_dtype=torch.float32, out=product)
    except (TypeError, RuntimeError, NotImplementedError):  # torch 2.8, 2.9: self must have the operands' dtype
        return MM_ONLY
    return FUSED


class Matmuls:
    """The float32-result products of one head's operands (``dtype`` on ``device``), by ``branch``'s choice.

    ``operand`` gives a tensor as the products take it (itself, or a float32 copy on ``UPCAST``: callers
    convert a chunk at a time, so that the float32 copy of the weight is never whole); ``mm`` and
    ``add_mm`` take operands so given.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.half = dtype in (torch.float16, torch.bfloat16)
        self.branch = branch(device.type, dtype)
        self._tf32 = self.half and self.branch == UPCAST and device.type == "cuda"

    def operand(self, a: torch.Tensor) -> torch.Tensor:
        return a.to(torch.float32) if self.half and self.branch == UPCAST else a

    def _context(self):
        return _tf32_on() if self._tf32 else contextlib.nullcontext()

    def mm(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``a @ b`` in float32, in ``out`` when given."""
        if self.half and self.branch != UPCAST:
            if out is None:
                return torch.mm(a, b, out_dtype=torch.float32)
            return torch.mm(a, b, out_dtype=torch.float32, out=out)
        with self._context():
            return torch.mm(a, b) if out is None else torch.mm(a, b, out=out)

    def add_mm(self, acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``acc += a @ b``, ``acc`` float32."""
        if self.half and self.branch == FUSED:
            return torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        if self.half and self.branch == MM_ONLY:
            return acc.add_(torch.mm(a, b, out_dtype=torch.float32))  # one float32 temporary like acc
        with self._context():
            return acc.addmm_(a, b)


@contextlib.contextmanager
def _tf32_on():
    """TF32 for a float32 matmul of upcast half-precision values (exact for them; see the module docstring)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
