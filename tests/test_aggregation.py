"""Each aggregation on a hand-built batch, with kept and valid counts.

No clipping and on-policy (r = 1), so l = -A per token with per-token advantages:
row 0: A = 1 2 3 (valid 3), row 1: A = 4 5 (valid 2, one padded column).
l: row 0 = -1 -2 -3, row 1 = -4 -5.
With the low_probability mask silencing row 0 t2 (p = 0.001 < 0.002, A > 0), kept l:
row 0 = -1 -2, row 1 = -4 -5.
"""

import math

import pytest
import torch

import rlstab

A = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def loss(aggregation, silence=False):
    logprobs = torch.full((2, 3), math.log(0.5))
    if silence:
        logprobs[0, 2] = math.log(0.001)
    batch = rlstab.TokenBatch(logprobs=logprobs.requires_grad_(), advantages=A, response_mask=MASK)
    masks = [{"kind": "low_probability"}] if silence else []
    objective = rlstab.load({"masks": masks, "surrogate": {"kind": "none"}, "aggregation": aggregation})
    return objective.compile()(batch).loss.item()


@pytest.mark.parametrize(
    "aggregation, silence, expected",
    [
        ({"kind": "token-mean", "count": "valid"}, False, -15 / 5),
        ({"kind": "token-mean", "count": "valid"}, True, -12 / 5),
        ({"kind": "token-mean", "count": "kept"}, True, -12 / 4),
        # no denominator: -1 - 2 - 3 - 4 - 5 = -15; silenced: -15 + 3 = -12
        ({"kind": "token-sum", "count": "valid"}, False, -15.0),
        ({"kind": "token-sum", "count": "kept"}, True, -12.0),
        # row means -2 and -4.5
        ({"kind": "seq-mean-token-mean", "count": "valid"}, False, (-2 - 4.5) / 2),
        # kept: row 0 (-1 - 2) / 2 kept = -1.5; valid: (-1 - 2) / 3 valid = -1
        ({"kind": "seq-mean-token-mean", "count": "kept"}, True, (-1.5 - 4.5) / 2),
        ({"kind": "seq-mean-token-mean", "count": "valid"}, True, (-1 - 4.5) / 2),
        # row sums -6 and -9
        ({"kind": "seq-mean-token-sum", "count": "valid"}, False, (-6 - 9) / 2),
        # padded length 3
        ({"kind": "seq-mean-token-sum-norm", "count": "valid", "norm": "max_length"}, False, (-6 - 9) / 2 / 3),
        ({"kind": "seq-mean-token-sum-norm", "count": "valid", "norm": 10}, False, (-6 - 9) / 2 / 10),
    ],
)
def test_hand_computed(aggregation, silence, expected):
    assert loss(aggregation, silence) == pytest.approx(expected)


def test_sequences_without_counted_tokens_leave_the_sequence_count():
    # Silence every token of row 0 (all p < 0.002, A > 0): with count kept only row 1 counts.
    logprobs = torch.full((2, 3), math.log(0.5))
    logprobs[0] = math.log(0.001)
    batch = rlstab.TokenBatch(logprobs=logprobs.requires_grad_(), advantages=A, response_mask=MASK)
    for count, expected in (("kept", -9 / 1), ("valid", -9 / 2)):
        objective = rlstab.load({"masks": [{"kind": "low_probability"}], "surrogate": {"kind": "none"},
                                 "aggregation": {"kind": "seq-mean-token-sum", "count": count}})
        assert objective.compile()(batch).loss.item() == pytest.approx(expected)


def test_aggregation_must_say_what_it_counts():
    with pytest.raises(rlstab.ConfigError, match=r"aggregation\.count: required"):
        rlstab.load({"aggregation": {"kind": "token-mean"}})


def test_is_weights_multiply_each_tokens_loss():
    # token-mean over valid tokens of -A * w: row 0 w = 1 0.5 2 -> -1 -1 -6; row 1 per-row w = 3 -> -12 -15.
    # (-1 - 1 - 6 - 12 - 15) / 5 = -7; d loss / d logp = -A w / 5 (r = 1).
    logprobs = torch.full((2, 3), math.log(0.5)).requires_grad_()
    weights = torch.tensor([[1.0, 0.5, 2.0], [3.0, 3.0, 3.0]])
    objective = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"}})
    out = objective.compile()(rlstab.TokenBatch(logprobs=logprobs, advantages=A, response_mask=MASK, is_weights=weights))
    assert out.loss.item() == pytest.approx(-7.0)
    out.loss.backward()
    assert torch.allclose(logprobs.grad, -A * weights * MASK / 5)
    per_row = rlstab.TokenBatch(logprobs=logprobs.detach(), advantages=A, response_mask=MASK, is_weights=torch.tensor([1.0, 3.0]))
    # row 0 weight 1: -6; row 1: -27 -> -33 / 5
    assert objective.compile()(per_row).loss.item() == pytest.approx(-33 / 5)
