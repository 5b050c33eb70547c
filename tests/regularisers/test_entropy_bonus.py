"""rlstab.regularisers.entropy_bonus: the loss adds -c * Agg(H), and the entropy must carry its gradient."""

from types import SimpleNamespace

import pytest
import torch

import rlstab
from rlstab.regularisers.entropy_bonus import EntropyBonus


def test_the_term_is_minus_the_entropy():
    entropy = torch.tensor([[0.5, 2.0]], dtype=torch.float64, requires_grad=True)
    term = EntropyBonus().term(SimpleNamespace(logprobs=torch.zeros(1, 2, requires_grad=True), entropy=entropy), None)
    assert term.dtype == torch.float32 and term.tolist() == [[-0.5, -2.0]]


def test_in_the_loss():
    # A = 0: L = 0.1 * mean over valid tokens of -H = 0.1 * -(1 + 3) / 2 = -0.2; dL/dH = -0.1 / 2 there
    entropy = torch.tensor([[1.0, 3.0, 9.0]], requires_grad=True)
    batch = rlstab.TokenBatch(
        logprobs=torch.full((1, 3), -1.0, requires_grad=True), old_logprobs=torch.full((1, 3), -1.0),
        advantages=torch.zeros(1), entropy=entropy, response_mask=torch.tensor([[True, True, False]]),
    )
    objective = rlstab.load({"aggregation": {"kind": "token-mean", "count": "valid"},
                             "regularisers": [{"kind": "entropy_bonus", "coef": 0.1}]})
    out = objective.compile()(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.2)
    assert torch.allclose(entropy.grad, torch.tensor([[-0.05, -0.05, 0.0]]))


def test_a_detached_entropy_is_refused_only_when_the_loss_has_a_gradient():
    detached = torch.ones(1, 2)
    with pytest.raises(ValueError, match="entropy_bonus needs TokenBatch.entropy with gradient"):
        EntropyBonus().term(SimpleNamespace(logprobs=torch.zeros(1, 2, requires_grad=True), entropy=detached), None)
    # no gradient anywhere (an evaluation): nothing to lose
    assert EntropyBonus().term(SimpleNamespace(logprobs=torch.zeros(1, 2), entropy=detached), None).tolist() == [[-1.0, -1.0]]


def test_defaults_bounds_and_reads():
    assert EntropyBonus().coef == 0.001 and EntropyBonus().reads == frozenset({"entropy"})
    assert EntropyBonus(coef=0.01).describe() == "entropy_bonus: + 0.01 * Agg(-H)"
    with pytest.raises(ValueError):
        EntropyBonus(coef=1.5)
