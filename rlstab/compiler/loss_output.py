"""A micro-batch's ``LossOutput``, with the check of its inputs' values riding on the metrics' read.

A loss that reads on the host (the CPU, or a call that is its own step) reads its metrics at once,
together with the extremes of every checked field, which the host judges finite and within the field's
limits (a log-prob at most 0, an entropy at least 0, up to rounding; no operation on the device but the
extremes, ``rlstab.deferred.AllFinite``): when an input offends the read raises ``OffendingInputs``,
and the call zeroes the padding's offending values (or raises for a valid token's) and runs again
(``offending_inputs``). A deferred call (a frozen step on a GPU) adds the check to the requirements
its metrics raise at their read.
"""

from __future__ import annotations

from collections.abc import Callable

from rlstab.batch import LossOutput, TokenBatch
from rlstab.compiler.loss_metrics import Reported
from rlstab.compiler.offending_inputs import OffendingInputs, value_check
from rlstab.deferred import Requirement
from rlstab.lazy import torch
from rlstab.metrics import Metrics

Deferred = tuple[list[Requirement], "Callable[[], Exception] | None"]
"""``(requirements, input_error)`` of a deferred call: its checks, and what to raise for an offending input
(None: the inputs were checked already, by the call's own step's gather)."""


def loss_output(
    batch: TokenBatch, loss: torch.Tensor, reported: Reported, checked: list[str], deferred: Deferred | None
) -> LossOutput:
    """The output, its inputs' values (the fields ``checked``) judged at the metrics' read.

    ``deferred``: the inputs' check (failing with ``input_error()``) joins the deferred checks,
    all left to the metrics' read. Without it everything is read here, with the metrics, and an
    offending input raises ``OffendingInputs`` (the caller cleans the batch and runs again).
    """
    if deferred is not None:  # read with the metrics, whenever they are read
        requirements, input_error = deferred
        if input_error is not None:
            requirements += value_check(batch, checked, input_error)
        return LossOutput(loss=loss, metrics=Metrics(reported.names, reported.values, requirements, reported.kinds))
    metrics = Metrics(reported.names, reported.values, value_check(batch, checked, OffendingInputs), reported.kinds)
    metrics.read()  # one host synchronisation per micro-batch (free on the CPU); the input check rides on it
    return LossOutput(loss=loss, metrics=metrics)
