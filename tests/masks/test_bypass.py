"""Bypass-mode rejection: rollout_rejection's tests on the policy ratio pi/pi_old, hand-computed."""

import math

import pytest
import torch

import rlstab
from rlstab.compiler.plan import Plan

LOSS = {"surrogate": {"kind": "reinforce"}, "aggregation": {"kind": "token-sum", "count": "valid"}}


def bypass_batch(ratios, mask=None):
    """A batch whose policy ratios pi/pi_old are ``ratios`` (old = the rollout's log-probs, log 0.01), A = 1."""
    old = torch.full((len(ratios), len(ratios[0])), math.log(0.01))
    logprobs = (old + torch.tensor(ratios).log()).requires_grad_()
    mask = torch.ones(old.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, response_mask=mask, advantages=torch.ones(len(ratios)))


def kept(mask: dict, batch) -> list:
    """The tokens that train: d loss / d logp = -A = -1 for a kept token (reinforce, token-sum)."""
    out = rlstab.load({**LOSS, "masks": [mask]}).compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    return [[round(v, 6) for v in row] for row in (-grad).tolist()]


def test_token_k1_band_on_the_policy_ratio():
    # high 2 -> band [0.5, 2]: 0.45 out, 0.55 in, 1 in, 1.9 in, 2.1 out
    batch = bypass_batch([[0.45, 0.55, 1.0, 1.9, 2.1]])
    assert kept({"kind": "bypass_rejection", "high": 2.0}, batch) == [[0, 1, 1, 1, 0]]


def test_sequence_mean_k3():
    # k3 = r - 1 - log r: r = 2 -> 0.30685; r = 1 -> 0; row 0 mean (0.30685 + 0) / 2 = 0.1534 > 0.1: rejected;
    # row 1: r = 1.2 -> 0.01768, r = 1 -> 0: mean 0.00884 <= 0.1: kept
    batch = bypass_batch([[2.0, 1.0], [1.2, 1.0]])
    mask = {"kind": "bypass_rejection", "level": "sequence_mean", "divergence": "k3", "high": 0.1}
    assert kept(mask, batch) == [[0, 0], [1, 1]]


def test_rejected_tokens_stay_in_the_denominators_by_default():
    # token-mean over valid tokens: 3 valid tokens, one rejected (r = 3): masked keeps the 1/3, padding makes it 1/2
    batch = bypass_batch([[1.0, 1.0, 3.0]])
    for rejected, share in (("masked", 1 / 3), ("padding", 1 / 2)):
        mask = {"kind": "bypass_rejection", "high": 2.0, "rejected": rejected}
        objective = rlstab.load({"surrogate": {"kind": "reinforce"}, "aggregation": {"kind": "token-mean", "count": "valid"},
                                 "masks": [mask]})
        out = objective.compile()(batch)
        (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
        assert (-grad)[0].tolist() == pytest.approx([share, share, 0.0])
    assert rlstab.load({**LOSS, "masks": [{"kind": "bypass_rejection", "high": 2.0}]}).masks[0].rejected == "masked"


def test_same_statistic_as_rollout_rejection_in_decoupled_mode():
    """bypass_rejection on (current, old) keeps what rollout_rejection keeps on (old, rollout) with the same values."""
    g = torch.Generator().manual_seed(0)
    a, b = -torch.rand(4, 9, generator=g) * 3, -torch.rand(4, 9, generator=g) * 3
    mask = torch.arange(9) < torch.tensor([[9], [5], [1], [7]])
    options = {"level": "sequence_sum", "divergence": "k1", "low": 0.3, "high": 3.0}
    bypass = rlstab.TokenBatch(logprobs=a.clone().requires_grad_(), old_logprobs=b, response_mask=mask,
                               advantages=torch.ones(4))
    decoupled = rlstab.TokenBatch(logprobs=a.clone().requires_grad_(), old_logprobs=a, rollout_logprobs=b,
                                  response_mask=mask, advantages=torch.ones(4))
    ours = kept({"kind": "bypass_rejection", **options}, bypass)
    theirs = kept({"kind": "rollout_rejection", **options, "rejected": "masked"}, decoupled)
    assert ours == theirs and 0 < sum(map(sum, ours)) < mask.sum()


def test_reads_no_rollout_logprobs():
    objective = rlstab.load({**LOSS, "masks": [{"kind": "bypass_rejection", "high": 2.0}]})
    assert "rollout_logprobs" not in {field for _, field in Plan.of(objective).reads}
    assert "pi/pi_old" in objective.masks[0].describe() and objective.masks[0].describe().startswith("bypass_rejection")
