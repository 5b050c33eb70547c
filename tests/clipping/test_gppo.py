"""GPPO / CE-GPPO: hand-computed values (the authors' compute_gppo_loss_general_beta), and the closed-form
gradient against autograd on the authors' r / sg(r) formula."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

CE = {"kind": "gppo", "eps_low": 0.2, "eps_high": 0.28, "beta_low": 0.5, "beta_high": 1.0, "dual_clip": 3.0}


def test_hand_computed_every_branch():
    out, grad = one_row([0.5, -0.5, 0.1, 1.5, -0.5], [1.0, -2.0, 1.0, -1.0, 1.0], CE)
    # r = [1.648721, 0.606531, 1.105171, 4.481689, 0.606531]
    # 1: A > 0, r > 1.28: l = -1.0 * 1.28 * 1 = -1.28, dl/dlogp = -1.28 (the bound's gradient, kept)
    # 2: A < 0, r < 0.8:  l = -0.5 * 0.8 * (-2) = 0.8, dl/dlogp = 0.8
    # 3: inside: l = -r A = -1.105171, dl/dlogp = -1.105171
    # 4: A < 0, r >= 0.8: -A r = 4.481689 > -c A = 3: dual-clip, l = 3, dl/dlogp = 0
    # 5: A > 0, r < 0.8 (PPO leaves it unclipped): l = -0.606531, dl/dlogp = -0.606531
    # token-mean: (-1.28 + 0.8 - 1.105171 + 3 - 0.606531) / 5 = 0.808298 / 5 = 0.1616596
    assert out.loss.item() == pytest.approx(0.1616596, abs=1e-6)
    expected = torch.tensor([-1.28, 0.8, -math.exp(0.1), 0.0, -math.exp(-0.5)]) / 5
    assert torch.allclose(grad, expected, atol=1e-7)
    assert out.metrics["clip/high_fraction"] == pytest.approx(0.2)
    assert out.metrics["clip/low_fraction"] == pytest.approx(0.2)
    assert out.metrics["clip/dual_fraction"] == pytest.approx(0.2)


def test_gppo_value_is_ppo_value_and_gradient_is_the_bound():
    gppo = {"kind": "gppo", "eps_low": 0.2, "eps_high": 0.28, "dual_clip": None}
    ppo = {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28}
    lr, adv = [0.5, -0.5, 0.1], [1.0, -2.0, 1.0]
    out, grad = one_row(lr, adv, gppo)
    ref, ref_grad = one_row(lr, adv, ppo)
    # beta = 1: the clipped values are PPO's, -1.28 * 1 and -0.8 * (-2) = 1.6; only the gradient differs
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-7)
    # PPO: [0, 0, -1.105171] / 3; GPPO: [-1.28, 1.6, -1.105171] / 3
    assert torch.allclose(ref_grad, torch.tensor([0.0, 0.0, -math.exp(0.1)]) / 3, atol=1e-7)
    assert torch.allclose(grad, torch.tensor([-1.28, 1.6, -math.exp(0.1)]) / 3, atol=1e-7)


def test_clamped_log_ratio_keeps_the_bound_gradient():
    # log r = 30 is clamped to 20 (r = e^20 > 1.28): the bound's gradient -1.28 A does not go through the clamp
    out, grad = one_row([30.0], [1.0], {"kind": "gppo", "dual_clip": None}, old=-40.0)
    assert grad.item() == pytest.approx(-1.28)
    assert out.loss.item() == pytest.approx(-1.28)


@pytest.mark.parametrize("config", [CE, {"kind": "gppo"}, {**CE, "beta_low": 0.0, "dual_clip": None},
                                    {**CE, "beta_low": 8.0, "dual_clip": 4.0}])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, config):
    cfg = rlstab.load({"surrogate": config, "aggregation": {"kind": "token-mean", "count": "valid"}}).surrogate
    el, eh, bl, bh, c = cfg.eps_low, cfg.eps_high, cfg.beta_low, cfg.beta_high, cfg.dual_clip
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad(config, batch)
    A = batch.advantages

    def per_token(lp):  # the authors' three cases (CE-GPPO core_algos.py lines 602-606), then the dual-clip min
        r = ratio(lp, batch)
        high = (r > 1 + eh) & (A > 0)
        low = (r < 1 - el) & (A < 0)
        gp = torch.exp(lp - lp.detach())  # r / sg(r) without the clamp, as the authors' unclamped ratio
        l1 = torch.where(high, -bh * (1 + eh) * gp * A, torch.where(low, -bl * (1 - el) * gp * A, -r * A))
        if c is None:
            return l1
        return torch.where(A < 0, torch.minimum(-A * c, l1), l1)

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert out.metrics["clip/high_fraction"] > 0 and out.metrics["clip/low_fraction"] > 0


def test_padding_and_an_all_masked_batch():
    batch = off_policy_batch(1)
    padded = rlstab.TokenBatch(
        logprobs=batch.logprobs.detach().clone().requires_grad_(), old_logprobs=batch.old_logprobs,
        advantages=batch.advantages, response_mask=torch.zeros_like(batch.response_mask),
    )
    out, grad = rlstab_loss_and_grad(CE, padded)
    assert out.loss.item() == 0.0 and torch.count_nonzero(grad) == 0


@pytest.mark.parametrize(("field", "value"), [("beta_low", -0.1), ("beta_high", 11.0), ("dual_clip", 1.1)])
def test_configuration_is_checked(field, value):
    with pytest.raises(rlstab.ConfigError, match=f"surrogate.*{field}|dual_clip"):
        rlstab.load({"surrogate": {"kind": "gppo", field: value}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_presets():
    g = rlstab.load("gppo").surrogate
    assert (g.eps_low, g.eps_high, g.beta_low, g.beta_high, g.dual_clip) == (0.2, 0.28, 1.0, 1.0, 10.0)
    ce = rlstab.load("ce_gppo")
    s = ce.surrogate
    assert (s.eps_low, s.eps_high, s.beta_low, s.beta_high, s.dual_clip) == (0.2, 0.2, 0.75, 1.0, 10.0)
    assert (ce.aggregation.kind, ce.aggregation.count) == ("token-mean", "valid")
