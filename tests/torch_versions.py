"""Stand-ins for ``torch.mm`` and ``torch.addmm`` as each range of torch versions has them (``out_dtype``).

- torch 2.7 and older: ``out_dtype`` is no argument of either (``TypeError``).
- torch 2.8 and 2.9: ``mm`` takes ``out_dtype``; ``addmm`` refuses a float32 ``self`` with half-precision
  operands (``RuntimeError``).
- torch 2.10 and later: both take it.

On CPU tensors the real torch implements neither (``aten::mm.dtype`` is CUDA's), so the stand-ins compute the
float32 product of the half-precision values, which is what cuBLAS returns up to the order of its sums. Their
own arithmetic runs outside any active TorchDispatchMode, so that a test recording the tensors a path makes
sees what the path asks for, as on CUDA, and not how the stand-in computes it.
"""

import torch
from torch.utils._python_dispatch import _disable_current_modes

REAL_MM, REAL_ADDMM = torch.mm, torch.addmm
HALF = (torch.float16, torch.bfloat16)


def _product(a, b, out):
    with _disable_current_modes():
        result = REAL_MM(a.float(), b.float())
        return out.copy_(result) if out is not None else result


def mm_until_2_7(a, b, *, out=None):  # no out_dtype keyword: TypeError if one is passed
    return REAL_MM(a, b, out=out) if out is not None else REAL_MM(a, b)


def addmm_until_2_7(self, a, b, *, beta=1, alpha=1, out=None):
    return REAL_ADDMM(self, a, b, beta=beta, alpha=alpha, out=out) if out is not None else REAL_ADDMM(self, a, b)


def mm_from_2_8(a, b, *, out_dtype=None, out=None):
    if out_dtype is None:
        return mm_until_2_7(a, b, out=out)
    if a.dtype not in HALF or out_dtype != torch.float32:
        raise RuntimeError("out_dtype is only supported for half-precision inputs and a float32 result")
    return _product(a, b, out)


def addmm_2_8(self, a, b, *, out_dtype=None, beta=1, alpha=1, out=None):
    if out_dtype is not None and self.dtype != a.dtype:
        raise RuntimeError("input dtypes must be the same")
    return addmm_until_2_7(self, a, b, beta=beta, alpha=alpha, out=out)


def addmm_from_2_10(self, a, b, *, out_dtype=None, beta=1, alpha=1, out=None):
    if out_dtype is None:
        return addmm_until_2_7(self, a, b, beta=beta, alpha=alpha, out=out)
    with _disable_current_modes():
        result = self + REAL_MM(a.float(), b.float())
        return out.copy_(result) if out is not None else result


VERSIONS = {
    "torch<=2.7": (mm_until_2_7, addmm_until_2_7, "upcast"),
    "torch2.8-2.9": (mm_from_2_8, addmm_2_8, "mm_only"),
    "torch>=2.10": (mm_from_2_8, addmm_from_2_10, "fused"),
}




def install(monkeypatch, version: str) -> list:
    """torch.mm and torch.addmm as ``version`` (a key of VERSIONS) has them, a fresh probe of
    rlstab.stats.half_matmul (its branch is cached), and the list of ``(function, out_dtype)`` calls made."""
    from rlstab.stats.half_matmul import branch

    mm, addmm, _ = VERSIONS[version]
    calls = []

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls.append((name, kwargs.get("out_dtype")))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(torch, "mm", spy("mm", mm))
    monkeypatch.setattr(torch, "addmm", spy("addmm", addmm))
    branch.cache_clear()
    return calls
