"""TOPR: hand-computed values (eq. 8 with token and sequence ratios, ROLL's set weights), and the closed-form
gradient against autograd on -sg(alpha) A log p."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab


def test_hand_computed_token_ratios():
    out, grad = one_row([0.5, 0.5, -0.5, 0.0], [1.0, -1.0, -2.0, 0.0], {"kind": "topr"}, old=-2.0)
    # log p = [-1.5, -1.5, -2.5, -2];  r = [1.6487, 1.6487, 0.60653, 1]
    # 1: A > 0, alpha = 1:                       l = -1 * 1 * (-1.5) = 1.5,                 dl/dlogp = -1
    # 2: A < 0, alpha = min(1.6487, 1) = 1:      l = -1 * (-1) * (-1.5) = -1.5,             dl/dlogp = 1
    # 3: A < 0, alpha = 0.60653:                 l = -0.60653 * (-2) * (-2.5) = -3.032653,  dl/dlogp = 1.213061
    # 4: A = 0: 0
    # token-mean: (1.5 - 1.5 - 3.032653) / 4 = -0.7581633
    assert out.loss.item() == pytest.approx(-0.7581633, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([-1.0, 1.0, 2 * math.exp(-0.5), 0.0]) / 4, atol=1e-7)
    assert out.metrics["clip/high_fraction"] == pytest.approx(0.25)  # token 2: a negative token with r > 1


def test_hand_computed_sequence_ratio():
    out, grad = one_row([0.5, -0.5, -0.5, 0.0], [1.0, -1.0, -2.0, 0.0], {"kind": "topr", "ratio_level": "sequence"}, old=-2.0)
    # the response's log-ratio: 0.5 - 0.5 - 0.5 + 0 = -0.5, alpha = e^-0.5 = 0.60653 on every negative token
    # 1: l = 1.5, dl/dlogp = -1;  2: l = -0.60653 * (-1) * (-2.5) = -1.516327, dl/dlogp = 0.60653
    # 3: l = -0.60653 * (-2) * (-2.5) = -3.032653, dl/dlogp = 1.213061
    # token-mean: (1.5 - 1.516327 - 3.032653) / 4 = -0.762245
    assert out.loss.item() == pytest.approx(-0.762245, abs=1e-6)
    a = math.exp(-0.5)
    assert torch.allclose(grad, torch.tensor([-1.0, a, 2 * a, 0.0]) / 4, atol=1e-7)


def test_set_weights():
    out, grad = one_row([0.5, 0.5, -0.5, 0.0], [1.0, -1.0, -2.0, 0.0],
                        {"kind": "topr", "positive_weight": 2.0, "negative_weight": 0.5}, old=-2.0)
    # 1: alpha = 2: l = 3, grad -2;  2: alpha = 0.5: l = -0.75, grad 0.5;  3: alpha = 0.5 * 0.60653 = 0.30327:
    # l = -0.30327 * (-2) * (-2.5) = -1.516327, grad 0.60653;  token-mean: (3 - 0.75 - 1.516327) / 4 = 0.1834183
    assert out.loss.item() == pytest.approx(0.1834183, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([-2.0, 0.5, math.exp(-0.5), 0.0]) / 4, atol=1e-7)


def test_clamped_log_ratio_still_trains():
    # log r = -30 is clamped to -20 for the weight (alpha = e^-20); the gradient goes through log p itself
    out, grad = one_row([-30.0], [-1.0], {"kind": "topr"}, old=-1.0)
    assert grad.item() == pytest.approx(math.exp(-20.0), rel=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, level):
    batch = off_policy_batch(seed, spread=0.3)
    config = {"kind": "topr", "ratio_level": level, "positive_weight": 1.5, "negative_weight": 0.7}
    out, grad = rlstab_loss_and_grad(config, batch)
    A, m = batch.advantages, batch.response_mask.to(torch.float32)

    def per_token(lp):  # -sg(alpha) A log p (ROLL / Trinity-RFT; the paper's trajectory ratio for "sequence")
        r = ratio(lp, batch)
        if level == "sequence":
            r = torch.exp((torch.log(r) * m).sum(-1, keepdim=True)).expand_as(r)
        alpha = torch.where(A > 0, 1.5, 0.7 * r.clamp(0.0, 1.0)).detach()
        return -alpha * A * lp

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)


def test_preset():
    o = rlstab.load("topr")
    assert (o.surrogate.ratio_level, o.surrogate.positive_weight, o.surrogate.negative_weight) == ("token", 1.0, 1.0)
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert o.advantage.kind == "grpo"
