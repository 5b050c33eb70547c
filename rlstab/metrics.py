"""A loss's metrics as floats by name, read from the device once, at the first access.

Reading a GPU value on the host stops the CPU until the GPU has run every kernel queued before it.
A loss that turned its metrics into floats would make that stop on every micro-batch, between the
forward and the backward the trainer is about to queue. [`Metrics`][rlstab.metrics.Metrics]
keeps them as 0-d device tensors (and plain numbers) until someone reads one; then it transfers
all of them at once (one synchronisation per device), together with the checks the loss deferred
([`rlstab.deferred`][rlstab.deferred]), and raises the first check that failed. A trainer that
reads the metrics after its backward, or after the optimizer step, never waits inside the loss.

Each metric also says how it combines over the micro-batches of one optimizer step
([`Metrics.combines`][rlstab.metrics.Metrics.combines]), as the loss declares it where it reports
it, and [`combine`][rlstab.metrics.combine] makes a step's metrics from its micro-batches' by
those kinds, so that no consumer parses metric names to decide:

- ``"sum"``: a count or a loss (``tokens/valid``, ``mask/<label>/kept``, ``loss``): the step's is
  the sum of the micro-batches', ``sum_k x_k``.
- ``"step"``: a value of the whole step, the same in every micro-batch (a mask's threshold,
  ``step/tokens_valid``, a stateful component's step value): the first micro-batch's, ``x_1``.
- ``"token_mean"``: a fraction or a mean over a micro-batch's valid tokens
  (``tokens/kept_fraction``, ``approx_kl``): weighted by each micro-batch's valid tokens,
  ``sum_k x_k n_k / sum_k n_k`` with ``n_k`` its ``tokens/valid`` (0 when no micro-batch has one).
- ``"min"``, ``"max"``: an extreme over a micro-batch's valid tokens (``mismatch/ratio_min``):
  ``min_k x_k``, ``max_k x_k`` over the micro-batches with a valid token (a micro-batch without one
  reports a finite placeholder, left out; when none has one, the first part's value).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal, NamedTuple, get_args

from rlstab.deferred import AllFinite, Requirement
from rlstab.lazy import torch

Combines = Literal["sum", "step", "token_mean", "min", "max"]
"""How a metric combines over the micro-batches of one optimizer step (see the module's docstring)."""

STEP_COUNTS = ("step/tokens_valid", "step/tokens_kept", "step/branch_tokens_valid", "step/branch_responses")
"""The step's denominators, reported by every loss (the branch stream's with ``dual_stream``): ``"step"``
metrics, the same in each micro-batch of an optimizer step, and each a count of that step, so that over
several optimizer steps (a trainer's updates of one rollout batch) they add up where other ``"step"``
values do not (``rlstab.trainer.loop.combine_updates``)."""


EXTREMES = {"min": min, "max": max}
"""The kinds that combine as an extreme of the parts' values, with the function that takes it."""


def extreme(kind: str, values: Sequence[float], valid: Sequence[float]) -> float:
    """``min`` or ``max`` (``kind``) of the values of the parts with valid tokens; the first value when none has one."""
    measured = [v for v, n in zip(values, valid) if n > 0]
    return EXTREMES[kind](measured) if measured else values[0]


class Element(NamedTuple):
    """One metric held as entry ``index`` of ``values``, a 1-d device tensor of several metrics that one
    operation computed (a loss divides all its fractions of the valid tokens at once): read with it."""

    values: torch.Tensor
    index: int


class Metrics(Mapping):
    """``LossOutput.metrics``: a read-only mapping of floats, in the order the loss reported them.

    Each value is rounded to float32, as a loss computes it. Any read (``metrics["loss"]``,
    ``dict(metrics)``, iteration, ``len``) transfers every value at once; later reads cost nothing.
    A check the loss deferred that failed raises at that first read, and at every later one; so
    does a ``loss`` entry that is not finite (``FloatingPointError``).
    ``dict(metrics)`` gives a plain dict (for ``json``, or to add entries), and so does pickling:
    the kinds (``combines``) stay with the ``Metrics`` the loss returned.

    Args:
        names: the metrics' names, in order.
        values: their values, one per name: 0-d tensors (read later), entries of a 1-d tensor
            (``rlstab.metrics.Element``, read later) or numbers.
        requirements: the checks the loss deferred to the read.
        kinds: how each metric combines over micro-batches (``"sum"``, ``"step"`` or
            ``"token_mean"``), one per name; without them ``combines`` raises.
    """

    def __init__(
        self,
        names: Sequence[str],
        values: Sequence[torch.Tensor | Element | float],
        requirements: Sequence[Requirement] = (),
        kinds: Sequence[Combines] | None = None,
    ):
        if len(names) != len(values):
            raise ValueError(f"{len(names)} metric names for {len(values)} values")
        if kinds is not None:
            if len(kinds) != len(names):
                raise ValueError(f"{len(kinds)} metric kinds for {len(names)} names")
            unknown = sorted(set(kinds) - set(get_args(Combines)))
            if unknown:
                raise ValueError(f"unknown metric kinds {unknown}; a metric combines as one of {get_args(Combines)}")
        self._kinds = None if kinds is None else dict(zip(names, kinds))
        self._names = list(names)
        # Only a value with a gradient is detached (the loss): a detach is an operation dispatched per value.
        self._values: list | None = [_detached(v) for v in values]
        self._requirements = list(requirements)
        self._host: dict[str, float] | None = None
        self._error: Exception | None = None

    def unread(self, name: str, default: float = 0.0) -> torch.Tensor | float:
        """One metric as the loss holds it, without reading anything: a 0-d device tensor, or a number
        (``default`` when absent). For code that keeps computing on the device (an adapter's own metric
        tensors). Once the metrics were read, the float. The deferred checks are not applied here."""
        if self._values is None:
            return self.read().get(name, default)
        value = next((v for n, v in zip(self._names, self._values) if n == name), default)
        return value.values[value.index] if isinstance(value, Element) else value

    def combines(self, name: str) -> Combines:
        """How metric ``name`` combines over the micro-batches of a step: ``"sum"``, ``"step"``,
        ``"token_mean"``, ``"min"`` or ``"max"`` (see [`rlstab.metrics`][rlstab.metrics]). Reads nothing
        from the device.

        Raises ``KeyError`` for a name the loss did not report, or when these metrics were made
        without kinds.
        """
        if self._kinds is None:
            raise KeyError(f"{name!r}: these metrics were made without kinds")
        if name not in self._kinds:
            raise KeyError(f"{name!r}: not one of these metrics")
        return self._kinds[name]

    def read(self) -> dict[str, float]:
        """The metrics as a dict of floats, after the deferred checks; raises the first that failed."""
        if self._error is not None:
            raise self._error
        if self._host is None:
            self._transfer()
        return self._host

    def _transfer(self) -> None:
        values, requirements = self._values, self._requirements
        sources: dict[int, int] = {}  # id of a device tensor (0-d, or a 1-d block of Elements) -> its position
        tensors: list[torch.Tensor] = []
        blocks: set[int] = set()
        conditions = [v for holds, _ in requirements for v in (holds.values if isinstance(holds, AllFinite) else (holds,))]
        for v in [*values, *conditions]:
            t = v.values if isinstance(v, Element) else v
            if isinstance(t, torch.Tensor) and id(t) not in sources:
                sources[id(t)] = len(tensors)
                if isinstance(v, Element):
                    blocks.add(len(tensors))
                tensors.append(t)
        read = _read_all(tensors, blocks)

        def device_value(v) -> float:
            if isinstance(v, Element):
                return read[sources[id(v.values)]][v.index]
            return read[sources[id(v)]][0]

        # Host numbers, rounded to float32 as the loss's tensors are (an array of C floats: no tensor made).
        numbers = iter(array("f", [float(v) for v in values if not isinstance(v, (torch.Tensor, Element))]).tolist())
        host = [device_value(v) if isinstance(v, (torch.Tensor, Element)) else next(numbers) for v in values]
        checks = [
            holds.judge([device_value(v) for v in holds.values])  # judged here, on the values read
            if isinstance(holds, AllFinite) else device_value(holds)
            for holds, _ in requirements
        ]
        self._values = self._requirements = None  # drop the device tensors and what the checks' messages held
        for (_, error), holds in zip(requirements, checks):
            if not holds:
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


def combine(parts: Sequence[Metrics]) -> dict[str, float]:
    """One optimizer step's metrics from its micro-batches' (``LossOutput.metrics``, in order).

    Each metric combines by its kind (``Metrics.combines``): ``"sum"`` adds the parts' values
    (Python ``sum``, in order), ``"step"`` takes the first part's, ``"token_mean"`` is
    ``sum(x_k * n_k) / (sum(n_k) or 1.0)`` with ``n_k`` the part's ``tokens/valid``, ``"min"`` and
    ``"max"`` the extreme over the parts with a valid token. A metric
    that some parts lack (a threshold of a micro-batch whose groups dynamic sampling all dropped)
    is combined over the parts that have it. Names come in the order they first appear.
    """
    for part in parts:
        if not isinstance(part, Metrics):
            raise TypeError(f"combine takes the losses' Metrics (they know each metric's kind), got {type(part).__name__}")
    out: dict[str, float] = {}
    for name in dict.fromkeys(name for part in parts for name in part):
        have = [part for part in parts if name in part]
        values = [part[name] for part in have]
        kind = have[0].combines(name)
        if kind == "sum":
            out[name] = sum(values)
        elif kind == "step":
            out[name] = values[0]
        elif kind in EXTREMES:
            out[name] = extreme(kind, values, [part["tokens/valid"] for part in have])
        else:
            weights = [part["tokens/valid"] for part in have]
            out[name] = sum(v * w for v, w in zip(values, weights)) / (sum(weights) or 1.0)
    return out


def _detached(value):
    if isinstance(value, Element):
        return Element(value.values.detach(), value.index) if value.values.requires_grad else value
    return value.detach() if isinstance(value, torch.Tensor) and value.requires_grad else value


def _read_all(tensors: list[torch.Tensor], blocks: set[int]) -> list[list[float]]:
    """The values of one-value tensors and of 1-d ``blocks`` (positions in ``tensors``), each as a list,
    rounded to float32, with one transfer per device."""
    out: list[list[float]] = [[] for _ in tensors]
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for indices in by_device.values():
        singles = [i for i in indices if i not in blocks]
        several = [i for i in indices if i in blocks]
        parts = [torch.stack([tensors[i].to(torch.float32).reshape(()) for i in singles])] if singles else []
        parts += [tensors[i].to(torch.float32) for i in several]
        flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist()  # the host synchronisation
        for j, i in enumerate(singles):
            out[i] = [flat[j]]
        start = len(singles)
        for i in several:
            out[i] = flat[start:start + tensors[i].numel()]
            start += tensors[i].numel()
    return out
