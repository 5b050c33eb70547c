"""A loss's metrics as floats by name, read from the device once, at the first access.

Reading a GPU value on the host stops the CPU until the GPU has run every kernel queued before it.
A loss that turned its metrics into floats would make that stop on every micro-batch, between the
forward and the backward the trainer is about to queue. [`Metrics`][rlstab.metrics.Metrics]
keeps them as 0-d device tensors (and plain numbers) until someone reads one; then it transfers
all of them at once (one synchronisation per device), together with the checks the loss deferred
([`rlstab.deferred`][rlstab.deferred]), and raises the first check that failed. A trainer that
reads the metrics after its backward, or after the optimizer step, never waits inside the loss.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence

from rlstab.deferred import Requirement
from rlstab.lazy import torch


class Metrics(Mapping):
    """``LossOutput.metrics``: a read-only mapping of floats, in the order the loss reported them.

    Each value is rounded to float32, as a loss computes it. Any read (``metrics["loss"]``,
    ``dict(metrics)``, iteration, ``len``) transfers every value at once; later reads cost nothing.
    A check the loss deferred that failed raises at that first read, and at every later one; so
    does a ``loss`` entry that is not finite (``FloatingPointError``).
    ``dict(metrics)`` gives a plain dict (for ``json``, or to add entries).
    """

    def __init__(
        self,
        names: Sequence[str],
        values: Sequence[torch.Tensor | float],
        requirements: Sequence[Requirement] = (),
    ):
        if len(names) != len(values):
            raise ValueError(f"{len(names)} metric names for {len(values)} values")
        self._names = list(names)
        self._values: list | None = [v.detach() if isinstance(v, torch.Tensor) else v for v in values]
        self._requirements = list(requirements)
        self._host: dict[str, float] | None = None
        self._error: Exception | None = None

    def unread(self, name: str, default: float = 0.0) -> torch.Tensor | float:
        """One metric as the loss holds it, without reading anything: a 0-d device tensor, or a number
        (``default`` when absent). For code that keeps computing on the device (an adapter's own metric
        tensors). Once the metrics were read, the float. The deferred checks are not applied here."""
        if self._values is None:
            return self.read().get(name, default)
        return next((v for n, v in zip(self._names, self._values) if n == name), default)

    def read(self) -> dict[str, float]:
        """The metrics as a dict of floats, after the deferred checks; raises the first that failed."""
        if self._error is not None:
            raise self._error
        if self._host is None:
            self._transfer()
        return self._host

    def _transfer(self) -> None:
        values, requirements = self._values, self._requirements
        tensors = [v for v in values if isinstance(v, torch.Tensor)] + [holds for holds, _ in requirements]
        read = _read_all(tensors)
        # Host numbers, rounded to float32 as the loss's tensors are (an array of C floats: no tensor made).
        numbers = iter(array("f", [float(v) for v in values if not isinstance(v, torch.Tensor)]).tolist())
        host = [next(read) if isinstance(v, torch.Tensor) else next(numbers) for v in values]
        self._values = self._requirements = None  # drop the device tensors and what the checks' messages held
        for _, error in requirements:
            if not next(read):
                self._error = error()
                raise self._error
        host = dict(zip(self._names, host))
        if "loss" in host and not math.isfinite(host["loss"]):
            self._error = FloatingPointError(f"the loss is not finite although every input is; metrics: {host}")
            raise self._error
        self._host = host

    def __getitem__(self, name: str) -> float:
        return self.read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.read())

    def __len__(self) -> int:
        return len(self.read())

    def __reduce__(self):
        """Pickled (to another process, or by ``copy.deepcopy``) as the plain dict it reads to."""
        return (dict, (self.read(),))

    def __repr__(self) -> str:
        if self._host is None and self._error is None:
            return f"Metrics(<{len(self._names)} values not read yet>)"
        return f"Metrics({self.read()!r})"


def _read_all(tensors: list[torch.Tensor]) -> Iterator[float]:
    """The values of 0-d tensors, in order, with one transfer per device."""
    out: list[float | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for indices in by_device.values():
        stacked = torch.stack([tensors[i].to(torch.float32).reshape(()) for i in indices])
        for i, value in zip(indices, stacked.tolist()):  # the host synchronisation
            out[i] = value
    return iter(out)
