"""Reductions over data-parallel ranks, or nothing in a single process.

Step statistics are summed or concatenated over every rank when ``torch.distributed`` is
initialised, so a threshold or denominator never depends on how many GPUs a run uses.
"""

from __future__ import annotations

from rlstab.lazy import distributed as dist
from rlstab.lazy import torch


class Comm:
    """Sum, max and concatenate tensors over the ranks of ``group`` (identity when not distributed).

    ``distributed``: None = whenever ``torch.distributed`` is initialised; False = never.
    """

    def __init__(self, group=None, distributed: bool | None = None):
        if distributed is None:
            distributed = dist.is_available() and dist.is_initialized()
        self.distributed = bool(distributed)
        self.group = group
        self.world_size = dist.get_world_size(group) if self.distributed else 1

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if not self.distributed:
            return t
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        if not self.distributed:
            return t
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate 1-D tensors of possibly different lengths, in rank order."""
        if not self.distributed:
            return t
        size = torch.tensor([t.numel()], device=t.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        dist.all_gather(sizes, size, group=self.group)
        sizes = [int(s) for s in sizes]
        longest = max(sizes)
        padded = torch.zeros(longest, dtype=t.dtype, device=t.device)
        padded[: t.numel()] = t
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])
