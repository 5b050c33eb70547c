"""Which code computes the token statistics for given tensors: the Triton kernels, or torch.

CUDA tensors of float16, bfloat16 or float32 go to the Triton kernels (``rlstab.stats.triton``) when
they import; everything else (CPU tensors, float64, a GPU without Triton) runs torch code. The
device is looked at before anything imports Triton, so CPU tensors never do.
"""

from __future__ import annotations

import functools
import warnings

from rlstab.lazy import torch


@functools.cache
def triton_imports() -> bool:
    """Whether the Triton kernels import (once per process). Triton missing: no, silently; installed but the
    kernels do not import (too old, broken): no, with one ``RuntimeWarning``."""
    try:
        import rlstab.stats.triton  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        return False
    except Exception as e:  # a Triton too old or broken for the kernels: say so once, and run the torch path
        warnings.warn(f"rlstab: the Triton kernels do not import ({type(e).__name__}: {e}); token statistics "
                      "run on the slower torch path", RuntimeWarning, stacklevel=3)
        return False
    return True


def on_gpu(*tensors) -> bool:
    """CUDA tensors of a dtype the GPU paths take (float16, bfloat16, float32): float64 stays on the exact torch path."""
    return all(t.device.type == "cuda" and t.dtype in (torch.float16, torch.bfloat16, torch.float32) for t in tensors)
