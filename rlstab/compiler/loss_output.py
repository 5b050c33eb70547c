"""A micro-batch's ``LossOutput``, with the check of its inputs' values riding on the metrics' read.

A loss that reads on the host (the CPU, or a call that is its own step) reads its metrics at once,
together with the extremes of every checked field, which the host judges finite and within the field's
limits (a log-prob at most 0, an entropy at least 0, up to rounding; no operation on the device but the
extremes, ``rlstab.deferred.AllFinite``): when an input offends it returns the checked fields instead,
and the call zeroes the padding's offending values (or raises for a valid token's,
``rlstab.non_finite``) and runs again. A deferred call
(a frozen step on a GPU) adds the check to the requirements its metrics raise at their read.
"""

from __future__ import annotations

from collections.abc import Callable

from rlstab.batch import LossOutput, TokenBatch
from rlstab.compiler.loss_metrics import Reported
from rlstab.deferred import Requirement
from rlstab.lazy import torch
from rlstab.metrics import Metrics
from rlstab.non_finite import within_limits

Deferred = tuple[list[Requirement], "Callable[[], Exception] | None"]
"""``(requirements, input_error)`` of a deferred call: its checks, and what to raise for an offending input
(None: the inputs were checked already, by the call's own step's gather)."""


def loss_output(
    batch: TokenBatch, loss: torch.Tensor, reported: Reported, checked: list[str], deferred: Deferred | None
) -> LossOutput | list[str]:
    """The output; ``checked`` (the fields to clean) instead when a checked input offends.

    ``deferred``: the inputs' check (failing with ``input_error()``) joins the deferred checks,
    all left to the metrics' read. Without it everything is read here, with the metrics.
    """
    if deferred is not None:  # read with the metrics, whenever they are read
        requirements, input_error = deferred
        sound = None if input_error is None else within_limits(batch, checked)
        if sound is not None:
            requirements.append((sound, input_error))
        return LossOutput(loss=loss, metrics=Metrics(reported.names, reported.values, requirements, reported.kinds))
    sound = within_limits(batch, checked)  # rides on the metrics' transfer
    requirements = [] if sound is None else [(sound, _OffendingInputs)]
    metrics = Metrics(reported.names, reported.values, requirements, reported.kinds)
    try:
        metrics.read()  # one host synchronisation per micro-batch (free on the CPU)
    except _OffendingInputs:
        return checked
    return LossOutput(loss=loss, metrics=metrics)


class _OffendingInputs(Exception):
    """An input of the checked path is not finite or beyond its field's limits: the call zeroes the padding
    (or raises) and runs again."""
