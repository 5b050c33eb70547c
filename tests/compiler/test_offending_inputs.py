"""``rlstab.compiler.offending_inputs``: offending values found, zeroed on padding, raised on valid tokens, and the
one retry (``OffendingInputs``), on a 2 x 3 batch whose valid tokens are worked out by hand.

The batch: response_mask [[1, 1, 0], [1, 0, 0]], so the valid tokens are (0, 0), (0, 1), (1, 0) and the
padding (0, 2), (1, 1), (1, 2); both responses have a response token, so both advantages are valid.
"""

import math

import pytest
import torch

import rlstab
from rlstab.batch import BatchError, TokenBatch
from rlstab.comm import Comm
from rlstab.compiler.loss_metrics import Reported
from rlstab.compiler.loss_output import loss_output
from rlstab.compiler.offending_inputs import (
    OffendingInputs,
    offending_flag,
    retried_without_bad_padding,
    value_check,
    with_padding_zeroed,
    without_bad_padding,
    zero_bad_padding,
    zeroed_up_front,
)
from rlstab.deferred import holds_now

MASK = torch.tensor([[True, True, False], [True, False, False]])
CHECKED = ["logprobs", "old_logprobs", "advantages"]


def batch(logprobs=None, old=None) -> TokenBatch:
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]]) if logprobs is None else logprobs
    old = torch.full((2, 3), -1.0) if old is None else old
    return TokenBatch(logprobs=lp, response_mask=MASK, old_logprobs=old, advantages=torch.tensor([1.0, -1.0]))


def with_value(at: tuple[int, int], value: float) -> TokenBatch:
    lp = batch().logprobs.clone()
    lp[at] = value
    return batch(logprobs=lp)


def test_a_sound_batch_raises_no_flag_and_passes_its_check():
    assert not offending_flag(batch(), CHECKED).item()
    (holds, _), = value_check(batch(), CHECKED, OffendingInputs)
    assert holds_now(holds)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.75])
def test_the_flag_sees_padding_too(value):
    # padding (0, 2): the flag is of the whole field (its extremes), padding included; 0.75 > 0 + 0.5 (ROUNDING)
    assert offending_flag(with_value((0, 2), value), CHECKED).item()


def test_a_log_prob_within_rounding_is_not_offending():
    # 0.5 is the limit itself (0 + ROUNDING): within
    assert not offending_flag(with_value((0, 0), 0.5), CHECKED).item()


def test_zero_bad_padding_zeroes_only_the_offending_padding():
    lp = batch().logprobs.clone()
    lp[0, 2], lp[1, 1] = math.nan, 2.0  # both padding: a NaN and a log-prob above 0.5
    cleaned, offences = zero_bad_padding(batch(logprobs=lp), CHECKED)
    assert offences == []
    # the two offending padding values become 0; (1, 2) = -2.5 is padding but sound: kept as it was
    assert cleaned.logprobs.tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, -2.5]]


def test_a_nan_on_a_valid_token_is_named_with_its_index():
    with pytest.raises(FloatingPointError) as info:
        without_bad_padding(with_value((0, 1), math.nan), CHECKED)
    assert str(info.value) == (
        "TokenBatch.logprobs has 1 value(s) on valid tokens that are not finite in float32 (first at index [0, 1]: nan)"
    )


def test_log_probs_above_zero_name_the_largest():
    lp = batch().logprobs.clone()
    lp[0, 0], lp[1, 0] = 1.0, 4.0  # two valid tokens beyond 0.5; the largest, 4, at [1, 0]
    with pytest.raises(BatchError) as info:
        without_bad_padding(batch(logprobs=lp), CHECKED)
    assert str(info.value) == (
        "TokenBatch.logprobs has 2 value(s) on valid tokens above 0.5, the largest 4 at index [1, 0]: a log-probability "
        "is at most 0 (0.5 allows for rounding). Logits or probabilities passed as log-probs?"
    )


def test_with_padding_zeroed_zeroes_every_padding_value_and_passes_the_gradient():
    lp = batch().logprobs.clone().requires_grad_(True)
    zeroed = with_padding_zeroed(batch(logprobs=lp), CHECKED)
    # padding (0, 2), (1, 1), (1, 2) -> 0 whatever it held; valid tokens as they were
    assert zeroed.logprobs.tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]
    zeroed.logprobs.sum().backward()
    assert lp.grad.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_zeroed_up_front_defers_the_valid_tokens_error():
    offending = with_value((1, 0), math.nan)  # a valid token
    zeroed, first_offence = zeroed_up_front(offending, CHECKED)
    assert math.isnan(zeroed.logprobs[1, 0].item())  # left for the deferred check to find
    assert zeroed.logprobs[1, 1].item() == 0.0  # padding
    error = first_offence()
    assert isinstance(error, FloatingPointError) and "first at index [1, 0]: nan" in str(error)


def test_retried_runs_once_more_on_the_cleaned_inputs():
    calls = []

    def run(x):
        calls.append(x)
        if x == "dirty":
            raise OffendingInputs
        return x.upper()

    assert retried_without_bad_padding(run, "dirty", lambda x: "clean") == "CLEAN"
    assert calls == ["dirty", "clean"]
    assert retried_without_bad_padding(run, "fine", lambda x: pytest.fail("cleaned a sound input")) == "FINE"


def test_retried_raises_the_cleaning_error_unchained():
    def run(x):
        raise OffendingInputs

    def clean(x):
        raise FloatingPointError("on a valid token")

    with pytest.raises(FloatingPointError) as info:
        retried_without_bad_padding(run, "dirty", clean)
    assert info.value.__context__ is None  # not "during handling of OffendingInputs"


def test_an_offence_left_after_cleaning_is_a_bug():
    def run(x):
        raise OffendingInputs

    with pytest.raises(AssertionError, match="offending inputs remained after zeroing the padding"):
        retried_without_bad_padding(run, "dirty", lambda x: x)


def test_the_loss_output_raises_offending_inputs_instead_of_returning_the_fields():
    # Before: loss_output returned the checked fields (a list) to say "retry"; now it raises.
    offending = with_value((1, 2), math.nan)  # padding
    reported = Reported()
    reported.add("loss", torch.tensor(0.0), "sum")
    with pytest.raises(OffendingInputs):
        loss_output(offending, torch.tensor(0.0), reported, CHECKED, None)


def test_the_step_gather_raises_offending_inputs_instead_of_flagging_them():
    # Before: StepPhase.gather returned Gathered(..., offending=True); now it raises, on every rank alike.
    loss_fn = rlstab.load("grpo").compile()
    tokens = [loss_fn._tokens(with_value((1, 2), math.nan))]
    with pytest.raises(OffendingInputs):
        loss_fn._step_phase.gather(tokens, Comm(distributed=False), check=True)
    loss_fn._step_phase.gather(tokens, Comm(distributed=False))  # without the check: nothing looked at


def test_offending_inputs_never_reach_the_caller():
    # NaN on padding, through every call path: the loss equals that of the batch with 0 there, on the CPU's read
    # and on the deferring path (own step: the gather's check; frozen step: padding zeroed up front).
    loss_fn = rlstab.load("grpo").compile()
    clean, offending = with_value((1, 2), 0.0), with_value((1, 2), math.nan)
    assert loss_fn.gather([offending]).counts == loss_fn.gather([clean]).counts  # 3 valid tokens, 2 rows
    for defer in (False, True):
        loss_fn.defer_checks = defer
        for step in (None, loss_fn.gather([clean])):
            assert torch.equal(loss_fn(offending, step=step).loss, loss_fn(clean, step=step).loss)
