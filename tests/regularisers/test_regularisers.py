"""KL estimators and the entropy bonus."""

import math

import pytest
import torch

import rlstab


def kl_loss(estimator, delta):
    logprobs = torch.tensor([[-1.0 + delta]], requires_grad=True)
    batch = rlstab.TokenBatch(
        logprobs=logprobs, advantages=torch.zeros(1), response_mask=torch.ones(1, 1, dtype=torch.bool),
        ref_logprobs=torch.tensor([[-1.0]]),
    )
    objective = rlstab.load({"aggregation": {"kind": "token-mean", "count": "valid"},
                             "regularisers": [{"kind": "kl", "coef": 0.5, "estimator": estimator}]})
    out = objective.compile()(batch)
    out.loss.backward()
    return out, logprobs.grad.item()


@pytest.mark.parametrize(
    "estimator, value, grad",
    [
        ("k1", 0.3, 1.0),  # k = delta; dk/dlogp = 1
        ("k2", 0.5 * 0.3**2, 0.3),  # k = delta^2 / 2; dk/dlogp = delta
        ("k3", math.exp(-0.3) + 0.3 - 1, 1 - math.exp(-0.3)),  # k = e^-delta + delta - 1
    ],
)
def test_kl_estimators(estimator, value, grad):
    out, g = kl_loss(estimator, 0.3)
    # A = 0, so the loss is coef * k alone.
    assert out.loss.item() == pytest.approx(0.5 * value, rel=1e-5)
    assert out.metrics["loss/kl"] == pytest.approx(value, rel=1e-5)
    assert g == pytest.approx(0.5 * grad, rel=1e-4)


def test_entropy_bonus_needs_entropy_with_gradient(make_batch):
    batch = make_batch(advantages="sequence")
    batch.entropy = batch.entropy.detach()
    objective = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]})
    with pytest.raises(ValueError, match="entropy with gradient"):
        objective.compile()(batch)


def test_entropy_bonus_pushes_entropy_up(make_batch):
    batch = make_batch(advantages="sequence")
    entropy = batch.entropy.detach().clone().requires_grad_()
    fields = {f: getattr(batch, f) for f in ("logprobs", "old_logprobs", "response_mask", "advantages")}
    objective = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]})
    out = objective.compile()(rlstab.TokenBatch(**fields, entropy=entropy))
    out.loss.backward()
    valid = batch.response_mask
    n = valid.sum()
    # loss += 0.01 * sum(-H) / n over valid tokens: dL/dH = -0.01 / n there, 0 on padding
    assert torch.allclose(entropy.grad[valid], torch.full((int(n),), -0.01 / n))
    assert (entropy.grad[~valid] == 0).all()
