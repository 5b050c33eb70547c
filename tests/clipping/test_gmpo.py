"""GMPO: hand-computed values, and the closed-form gradient against autograd of the paper's objective."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, rlstab_loss_and_grad

import rlstab

GMPO = {"kind": "gmpo", "eps_low": 0.4, "eps_high": 0.4}
AGG = "seq-mean-token-mean"


def test_unclipped_positive_advantage():
    out, grad = one_row([0.3, -0.1, 0.1], [2.0, 2.0, 2.0], GMPO, aggregation=AGG)
    s = math.exp(0.1)  # mean log r = (0.3 - 0.1 + 0.1) / 3 = 0.1; every log r inside [-0.4, 0.4]
    # one response of 3 tokens, seq-mean-token-mean: w = 1/3; l = -A s = -2 s per token -> loss = -2 s = -2.21034
    assert out.loss.item() == pytest.approx(-2 * s, abs=1e-6)
    # d/dlogp_t = (sum_t' w (-A)) * s / n = (-2) * s / 3 on every token
    assert torch.allclose(grad, torch.full((3,), -2 * s / 3), atol=1e-6)
    assert out.metrics["clip/high_fraction"] == 0.0


def test_token_clip_inside_the_geometric_mean():
    out, grad = one_row([1.0, -1.0, 0.2], [1.0, 1.0, 1.0], GMPO, aggregation=AGG)
    # A > 0: log r clipped above at 0.4 only: [0.4, -1.0, 0.2] -> mean = -0.4/3 = -0.133333, s = 0.875173
    # (GSPO would clip the mean of the raw log-ratios, 0.0667: nothing clipped)
    s = math.exp(-0.4 / 3)
    assert out.loss.item() == pytest.approx(-s, abs=1e-6)
    # the clipped token gets no gradient; the two others (-1) * s / 3
    assert torch.allclose(grad, torch.tensor([0.0, -s / 3, -s / 3]), atol=1e-6)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 3)


def test_negative_advantage_clips_below():
    out, grad = one_row([-1.0, 0.9, 0.1], [-1.0, -1.0, -1.0], GMPO, aggregation=AGG)
    # A < 0: log r clipped below at -0.4 only: [-0.4, 0.9, 0.1] -> mean = 0.2, s = 1.221403; l = -A s = s
    s = math.exp(0.2)
    assert out.loss.item() == pytest.approx(s, abs=1e-6)
    # d/dlogp_t = (sum w (-A)) s / n = (+1) s / 3 on the unclipped tokens
    assert torch.allclose(grad, torch.tensor([0.0, s / 3, s / 3]), atol=1e-6)
    assert out.metrics["clip/low_fraction"] == pytest.approx(1 / 3)
    assert out.metrics["clip/high_fraction"] == 0.0


def test_zero_advantage_trains_nothing():
    out, grad = one_row([0.3, 2.0], [0.0, 0.0], GMPO, aggregation=AGG, old=-3.0)  # log-probs at most 0
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(2))


def test_narrow_asymmetric_bounds():
    out, _ = one_row([0.3, 0.3], [1.0, 1.0], {"kind": "gmpo", "eps_low": 0.1, "eps_high": 0.2}, aggregation=AGG)
    # A > 0: min(0.3, 0.2) = 0.2 per token -> s = e^0.2; l = -s
    assert out.loss.item() == pytest.approx(-math.exp(0.2), abs=1e-6)


def reference(batch, eps_low, eps_high):
    """The paper's objective by autograd: (1/S) sum_i -mean_t(A_i,t) * exp(mean_t clipped log r), S non-empty rows."""
    lp = batch.logprobs.detach().clone().requires_grad_()
    m = batch.response_mask.to(torch.float32)
    adv = batch.advantages
    x = (lp - batch.old_logprobs).clamp(-20.0, 20.0)
    sgn = torch.sign(adv)
    y = sgn * torch.minimum(sgn * x, sgn * x.clamp(-eps_low, eps_high))  # veRL's form of the token clip
    n = m.sum(-1)
    s = torch.exp((y * m).sum(-1) / n.clamp(min=1))
    a_bar = (adv * m).sum(-1) / n.clamp(min=1)
    rows = n > 0
    loss = (-(a_bar * s))[rows].sum() / rows.sum()
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@pytest.mark.parametrize("bounds", [(0.4, 0.4), (0.1, 0.3)])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, bounds):
    batch = off_policy_batch(seed, spread=1.0)  # per-token advantages of both signs, exact zeros, ragged rows
    out, grad = rlstab_loss_and_grad({"kind": "gmpo", "eps_low": bounds[0], "eps_high": bounds[1]}, batch, AGG)
    ref, ref_grad = reference(batch, *bounds)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert out.metrics["clip/high_fraction"] > 0 and out.metrics["clip/low_fraction"] > 0


def test_padding_is_ignored():
    lp = torch.tensor([[-1.0, 50.0], [-2.0, -0.5]]).requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=torch.tensor([[-1.2, -50.0], [-2.5, -0.5]]),
                              advantages=torch.tensor([1.0, -1.0]), response_mask=torch.tensor([[True, False], [True, True]]))
    objective = rlstab.load({"surrogate": GMPO, "aggregation": {"kind": AGG, "count": "valid"}})
    out = objective.compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, lp)
    # row 0: s = e^0.2; row 1 (A < 0): log r = [0.5, 0] -> s = e^0.25;  loss = (-e^0.2 + e^0.25) / 2
    assert out.loss.item() == pytest.approx((-math.exp(0.2) + math.exp(0.25)) / 2, abs=1e-6)
    assert grad[0, 1] == 0.0 and torch.isfinite(grad).all()


def test_preset():
    o = rlstab.load("gmpo")
    assert (o.surrogate.kind, o.surrogate.eps_low, o.surrogate.eps_high) == ("gmpo", 0.4, 0.4)
    assert (o.aggregation.kind, o.aggregation.count) == (AGG, "valid")
    assert o.advantage.kind == "grpo"
