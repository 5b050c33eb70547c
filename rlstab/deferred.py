"""Checks of device values that need not stop the host: raised now on the CPU, at the metrics' read on a GPU.

A check such as "every group id of this micro-batch was in the step" reads a device value. On a
GPU, reading it (``bool(tensor)``) makes the CPU wait until every queued kernel has run, inside
the loss call, before the trainer can queue its backward. So inside a loss call that defers its
checks (a frozen-step call on a GPU: [`CompiledObjective`][rlstab.CompiledObjective]),
[`require`][rlstab.deferred.require] only records the condition; the loss's
[`Metrics`][rlstab.metrics.Metrics] read all of them with the metrics themselves, in the one
transfer that reading the metrics makes, and raise the first that failed. Everywhere else (the
CPU, a step's gather, code outside a loss) ``require`` checks at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

from rlstab.lazy import torch


class AllFinite(NamedTuple):
    """A condition judged on the host where it is read: every one of ``values`` (0-d tensors) is finite in
    float32, and within its ``(low, high)`` of ``limits`` when they are given (one pair per value). As a
    requirement's ``holds`` it costs no operation on the device: the values travel with the metrics, and the
    host looks at them."""

    values: tuple
    limits: tuple = ()
    NO_LIMITS = (-math.inf, math.inf)

    def judge(self, read: Sequence[float]) -> bool:
        """Whether the condition holds, given ``values`` as read on the host (floats, in order)."""
        limits = self.limits or [self.NO_LIMITS] * len(read)
        return all(math.isfinite(x) and low <= x <= high for x, (low, high) in zip(read, limits))

    def on_device(self) -> torch.Tensor:
        """The condition as a 0-d bool tensor (no host synchronisation)."""
        values = torch.stack([v.to(torch.float32) for v in self.values])
        holds = torch.isfinite(values).all()
        for value, (low, high) in zip(values, self.limits):
            if (low, high) != self.NO_LIMITS:
                holds = holds & (value >= low) & (value <= high)
        return holds


Requirement = tuple["torch.Tensor | AllFinite", Callable[[], Exception]]
"""``(holds, error)``: a 0-d bool tensor (or an ``AllFinite``), and what to raise
when it is False."""


def holds_now(holds: torch.Tensor | AllFinite) -> bool:
    """A requirement's condition, read now (a host synchronisation on a GPU)."""
    if isinstance(holds, AllFinite):
        return holds.judge([float(v.to(torch.float32)) for v in holds.values])
    return bool(holds)


_PENDING: ContextVar[list[Requirement] | None] = ContextVar("rlstab_deferred_requirements", default=None)


def require(holds: torch.Tensor | AllFinite, error: Callable[[], Exception]) -> None:
    """Raise ``error()`` unless ``holds`` (a 0-d bool tensor, or an ``AllFinite``) is True: at once, or, within
    [`deferring`][rlstab.deferred.deferring], when the loss's metrics are read.

    ``error`` is called only when the check failed, so its message may read tensors (the
    offending values) at no cost on the usual path.
    """
    pending = _PENDING.get()
    if pending is None:
        if not holds_now(holds):  # host sync: outside a deferring loss call
            raise error()
    else:
        pending.append((holds, error))


@contextmanager
def deferring(active: bool = True) -> Iterator[list[Requirement]]:
    """Within it (when ``active``), [`require`][rlstab.deferred.require] records instead of checking;
    yields the list it records into."""
    if not active:
        yield []
        return
    pending: list[Requirement] = []
    token = _PENDING.set(pending)
    try:
        yield pending
    finally:
        _PENDING.reset(token)
