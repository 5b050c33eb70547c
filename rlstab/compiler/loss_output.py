"""A micro-batch's ``LossOutput``, with the check that its inputs are finite riding on the metrics' read.

A loss that reads on the host (the CPU, or a call that is its own step) reads its metrics at once,
together with the extremes of every checked field, which the host judges finite (no operation on the
device but the extremes, ``rlstab.deferred.AllFinite``): when an input is not finite it
returns the checked fields instead, and the call zeroes the padding's non-finite values (or raises
for a valid token's, ``rlstab.non_finite``) and runs again. A deferred call
(a frozen step on a GPU) adds the check to the requirements its metrics raise at their read.
"""

from __future__ import annotations

from collections.abc import Callable

from rlstab.batch import LossOutput, TokenBatch
from rlstab.compiler.loss_metrics import Reported
from rlstab.deferred import AllFinite, Requirement
from rlstab.lazy import torch
from rlstab.metrics import Metrics
from rlstab.non_finite import extremes

Deferred = tuple[list[Requirement], "Callable[[], Exception] | None"]
"""``(requirements, input_error)`` of a deferred call: its checks, and what to raise for a non-finite input
(None: the inputs were checked already, by the call's own step's gather)."""


def loss_output(
    batch: TokenBatch, loss: torch.Tensor, reported: Reported, checked: list[str], deferred: Deferred | None
) -> LossOutput | list[str]:
    """The output; ``checked`` (the fields to clean) instead when a checked input is not finite.

    ``deferred``: the inputs' finiteness (failing with ``input_error()``) joins the deferred checks,
    all left to the metrics' read. Without it everything is read here, with the metrics.
    """
    if deferred is not None:  # read with the metrics, whenever they are read
        requirements, input_error = deferred
        finite = None if input_error is None else _inputs_finite(batch, checked)
        if finite is not None:
            requirements.append((finite, input_error))
        return LossOutput(loss=loss, metrics=Metrics(reported.names, reported.values, requirements, reported.kinds))
    finite = _inputs_finite(batch, checked)  # rides on the metrics' transfer
    requirements = [] if finite is None else [(finite, _NonFiniteInputs)]
    metrics = Metrics(reported.names, reported.values, requirements, reported.kinds)
    try:
        metrics.read()  # one host synchronisation per micro-batch (free on the CPU)
    except _NonFiniteInputs:
        return checked
    return LossOutput(loss=loss, metrics=metrics)


def _inputs_finite(batch: TokenBatch, fields: list[str]) -> AllFinite | None:
    """Every value of ``fields`` is finite: min and max of each field are finite iff every value is, which the
    host judges when it reads them with the metrics (no other operation on the device)."""
    bounds = extremes(batch, fields)
    return AllFinite(tuple(bounds)) if bounds else None


class _NonFiniteInputs(Exception):
    """An input of the checked path is not finite: the call zeroes the padding (or raises) and runs again."""
