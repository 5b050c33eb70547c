"""``rlstab.compiler.loss_output``: a micro-batch's ``LossOutput``, its inputs' check riding on the metrics' read.

The batch: response_mask [[1, 1], [1, 0]]; its checked fields are logprobs and advantages.
"""

import math

import pytest
import torch

from rlstab.batch import LossOutput, TokenBatch
from rlstab.compiler.loss_metrics import Reported
from rlstab.compiler.loss_output import loss_output
from rlstab.compiler.offending_inputs import OffendingInputs

MASK = torch.tensor([[True, True], [True, False]])
CHECKED = ["logprobs", "advantages"]


class InputError(Exception):
    pass


def batch(at=None, value=None):
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    if at is not None:
        logprobs[at] = value
    return TokenBatch(logprobs=logprobs, response_mask=MASK, advantages=torch.tensor([1.0, -1.0]))


def reported():
    r = Reported()
    r.add("loss", torch.tensor(0.25), "sum")
    r.add("tokens", torch.tensor(3.0), "step")
    return r


def test_read_at_once_the_metrics_are_the_reported_values():
    loss = torch.tensor(0.25)
    out = loss_output(batch(), loss, reported(), CHECKED, None)
    assert isinstance(out, LossOutput) and out.loss is loss
    assert dict(out.metrics) == {"loss": 0.25, "tokens": 3.0}
    assert (out.metrics.combines("loss"), out.metrics.combines("tokens")) == ("sum", "step")


@pytest.mark.parametrize("at, value", [((0, 1), math.nan), ((1, 0), math.inf), ((0, 0), 1.0), ((1, 1), math.nan)])
def test_read_at_once_an_offending_input_raises_offending_inputs(at, value):
    # A non-finite log-prob, or one of 1.0 (above 0 by more than the rounding allowance, VALUE_LIMITS: 0.5),
    # on a valid token or on the padding (1, 1):
    # the caller zeroes the padding's and runs again, so the padding is judged too.
    with pytest.raises(OffendingInputs):
        loss_output(batch(at, value), torch.tensor(0.25), reported(), CHECKED, None)


def test_deferred_the_check_raises_its_error_at_the_metrics_read():
    out = loss_output(batch((0, 1), math.nan), torch.tensor(0.25), reported(), CHECKED, ([], InputError))
    with pytest.raises(InputError):  # nothing raised before the read
        dict(out.metrics)


def test_deferred_sound_inputs_read_as_the_reported_values():
    out = loss_output(batch(), torch.tensor(0.25), reported(), CHECKED, ([], InputError))
    assert dict(out.metrics) == {"loss": 0.25, "tokens": 3.0}


def test_deferred_without_an_input_error_the_inputs_are_not_checked_again():
    # None: the call's own step's gather checked them already.
    out = loss_output(batch((0, 1), math.nan), torch.tensor(0.25), reported(), CHECKED, ([], None))
    assert dict(out.metrics) == {"loss": 0.25, "tokens": 3.0}
