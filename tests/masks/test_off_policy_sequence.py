"""DeepSeek-V3.2's off-policy sequence mask, hand-computed."""

import math

import pytest
import torch

import rlstab
from rlstab.compiler.plan import Plan

LOSS = {"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-sum", "count": "valid"}}
LENGTHS = [2, 3, 1]
ADVANTAGES = [-1.0, -1.0, 1.0]
# log pi_sampling - log pi_theta per token (padding: junk the mask must ignore)
GAPS = [[0.5, 0.7, math.nan], [0.2, 0.4, 0.6], [2.0, math.inf, -math.inf]]


def batch(gaps=GAPS, lengths=LENGTHS, advantages=ADVANTAGES, field="rollout_logprobs"):
    """On-policy (old = current), current log-probability -4 everywhere, the sampling policy's = -4 + gap (at most
    0 on the valid tokens)."""
    B, T = len(gaps), len(gaps[0])
    current = torch.full((B, T), -4.0)
    sampling = current + torch.tensor(gaps)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    extra = {field: sampling} if field == "rollout_logprobs" else {"old_logprobs": sampling}
    return rlstab.TokenBatch(logprobs=current.clone().requires_grad_(), response_mask=mask,
                             advantages=torch.tensor(advantages), **extra)


def trained(mask: dict, b, loss=LOSS):
    """d loss / d logp per token (surrogate none, r = 1 on-policy: -A on kept tokens, 0 on silenced)."""
    out = rlstab.load({**loss, "masks": [mask]}).compile()(b)
    (grad,) = torch.autograd.grad(out.loss, b.logprobs)
    return grad, out


def test_negative_far_responses_are_silenced():
    # row 0: A = -1, mean gap (0.5 + 0.7) / 2 = 0.6 > 0.5: silenced
    # row 1: A = -1, mean gap (0.2 + 0.4 + 0.6) / 3 = 0.4 <= 0.5: trains (-A = 1 per token)
    # row 2: A = +1, mean gap 2.0 > 0.5, but A >= 0: trains (-A = -1)
    grad, out = trained({"kind": "off_policy_sequence", "threshold": 0.5}, batch())
    assert grad.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]]
    assert out.metrics["mask/off_policy_sequence/kept"] == 4.0


def test_the_threshold_is_strict():
    # one token, gap exactly 0.5 = delta: not above it, so the response trains
    b = batch(gaps=[[0.5]], lengths=[1], advantages=[-1.0])
    grad, _ = trained({"kind": "off_policy_sequence", "threshold": 0.5}, b)
    assert grad.tolist() == [[1.0]]
    grad, _ = trained({"kind": "off_policy_sequence", "threshold": 0.49}, b)
    assert grad.tolist() == [[0.0]]


def test_zero_advantage_is_never_silenced():
    b = batch(gaps=[[3.0]], lengths=[1], advantages=[0.0])
    _, out = trained({"kind": "off_policy_sequence", "threshold": 0.5}, b)
    assert out.metrics["mask/off_policy_sequence/kept"] == 1.0


def test_behaviour_old_reads_old_logprobs():
    # The same gaps between old_logprobs and the current policy: on old_logprobs the ratio r = exp(-gap),
    # so test the keep pattern through the mask's metric (no rollout_logprobs needed).
    b = batch(field="old_logprobs", gaps=[[0.5, 0.7, 0.0], [0.2, 0.4, 0.6], [2.0, 0.0, 0.0]])
    _, out = trained({"kind": "off_policy_sequence", "threshold": 0.5, "behaviour": "old"}, b)
    assert out.metrics["mask/off_policy_sequence/kept"] == 4.0
    assert Plan.of(rlstab.load({**LOSS, "masks": [{"kind": "off_policy_sequence", "threshold": 0.5, "behaviour": "old"}]})).readers(
        "rollout_logprobs") == []


def test_silenced_tokens_stay_in_the_valid_denominator():
    # token-mean over valid tokens: 6 valid tokens; kept: row 1 (l = -A r = 1 each, 3 tokens), row 2 (l = -1)
    loss = {"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"}}
    _, out = trained({"kind": "off_policy_sequence", "threshold": 0.5}, batch(), loss)
    assert out.loss.item() == pytest.approx((3 * 1.0 - 1.0) / 6)


def test_per_token_advantages_test_each_token():
    b = batch()
    b = rlstab.TokenBatch(logprobs=b.logprobs, response_mask=b.response_mask, rollout_logprobs=b.rollout_logprobs,
                          advantages=torch.tensor([[-1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [1.0, 0.0, 0.0]]))
    grad, _ = trained({"kind": "off_policy_sequence", "threshold": 0.5}, b)
    # row 0 is far: its A < 0 token is silenced, its A > 0 token trains
    assert grad[0].tolist() == [0.0, -1.0, 0.0]


def test_needs_rollout_logprobs_and_a_threshold():
    objective = rlstab.load({**LOSS, "masks": [{"kind": "off_policy_sequence", "threshold": 0.5}]})
    b = rlstab.TokenBatch(logprobs=torch.zeros(1, 2), advantages=torch.ones(1), response_mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(rlstab.BatchError, match="rollout_logprobs"):
        objective.compile()(b)
    with pytest.raises(rlstab.ConfigError, match="threshold"):
        rlstab.load({**LOSS, "masks": [{"kind": "off_policy_sequence"}]})
