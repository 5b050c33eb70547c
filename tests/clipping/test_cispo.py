"""CISPO: hand-computed values (MiniMax-M1's objective), and the closed-form gradient against autograd."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

CISPO = {"kind": "cispo", "max_weight": 5.0, "min_weight": 0.0}


def test_hand_computed():
    out, grad = one_row([2.0, 0.0, -0.5, 1.7], [1.0, -2.0, 1.0, -1.0], CISPO, old=-3.0)
    # log p = -3 + log r = [-1, -3, -3.5, -1.3];  r = [7.389, 1, 0.60653, 5.4739];  w = min(r, 5) = [5, 1, 0.60653, 5]
    # l = -w A log p:  -5*1*(-1) = 5;  -1*(-2)*(-3) = -6;  -0.60653*1*(-3.5) = 2.12286;  -5*(-1)*(-1.3) = -6.5
    # token-mean: (5 - 6 + 2.12286 - 6.5) / 4 = -1.344285
    assert out.loss.item() == pytest.approx(-1.344285, abs=1e-5)
    # dl/dlogp = -w A: [-5, 2, -0.60653, 5] / 4; the truncated tokens keep their gradient
    assert torch.allclose(grad, torch.tensor([-5.0, 2.0, -math.exp(-0.5), 5.0]) / 4, atol=1e-6)
    assert out.metrics["clip/high_fraction"] == 0.5  # r = 7.389 and 5.474 are above 5
    assert out.metrics["clip/low_fraction"] == 0.0


def test_lower_truncation():
    out, grad = one_row([-0.5], [1.0], {"kind": "cispo", "max_weight": 5.0, "min_weight": 0.8}, old=-3.0)
    # r = 0.60653 < 0.8: w = 0.8; l = -0.8 * 1 * (-3.5) = 2.8; dl/dlogp = -0.8
    assert out.loss.item() == pytest.approx(2.8, abs=1e-6)
    assert grad.item() == pytest.approx(-0.8, abs=1e-7)
    assert out.metrics["clip/low_fraction"] == 1.0


def test_clamped_log_ratio_still_trains():
    # log r = 30 is clamped to 20 for the weight; the gradient flows through log p itself: -min(e^20, 5) A
    out, grad = one_row([30.0], [1.0], CISPO, old=-40.0)
    assert grad.item() == pytest.approx(-5.0)


@pytest.mark.parametrize("bounds", [(0.0, 5.0), (0.8, 1.28)])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, bounds):
    low, high = bounds
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad({"kind": "cispo", "min_weight": low, "max_weight": high}, batch)

    def per_token(lp):  # MiniMax-M1: -sg(clip(r)) A log p
        return -ratio(lp, batch).clamp(low, high).detach() * batch.advantages * lp

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert out.metrics["clip/high_fraction"] > 0


@pytest.mark.parametrize(("field", "value"), [("max_weight", 0.5), ("min_weight", 1.5), ("min_weight", -0.1)])
def test_bounds_are_checked(field, value):
    # max_weight >= 1 >= min_weight >= 0, so the truncation interval always contains r = 1
    with pytest.raises(rlstab.ConfigError, match=f"surrogate.*{field}"):
        rlstab.load({"surrogate": {"kind": "cispo", field: value}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_preset():
    o = rlstab.load("cispo")
    assert (o.surrogate.max_weight, o.surrogate.min_weight) == (5.0, 0.0)
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
