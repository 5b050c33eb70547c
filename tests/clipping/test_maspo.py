"""MASPO: hand-computed gates from the authors' released formula, and the gradient against autograd."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

MASPO = {"kind": "maspo"}  # authors' defaults: sigma_base 1, alpha 0.3, sigma_high 10, beta 0.03, [0.1, 10]


def test_hand_computed():
    adv = [1.0, -2.0, 1.0, -1.0, 3.0, -1.0]
    p_old = [0.5, 0.001, 0.5, 0.5, 0.1, 1e-6]  # every p_old * r at most 1: log-probs at most 0
    log_r = [0.5, -1.0, -0.5, 0.4, 2.0, -1.5]
    old = [math.log(p) for p in p_old]
    out, grad = one_row(log_r, adv, MASPO, old=old)
    # sigma = clip(1 / p_old^0.3, 1, 10) * (clip(1 + 0.03 A, .1, 10) if A > 0 else clip(1 / (1 - 0.03 A), .1, 10))
    # token A   p_old  r        gated?         sigma                        g = exp(-(r-1)^2 / 2 sigma^2)  l = -A g r
    # 1     +1  0.5    1.64872  A>0, r>1       1.2311444 * 1.03 = 1.2680787   0.8773441                    -1.4464958
    # 2     -2  0.001  0.36788  A<0, r<1       7.9432823 * 1/1.06 = 7.4936626 0.9964485                     0.7331459
    # 3     +1  0.5    0.60653  no (r < 1)     -                            1                            -0.6065307
    # 4     -1  0.5    1.49182  no (r > 1)     -                            1                             1.4918247
    # 5     +3  0.1    7.38906  A>0, r>1       1.9952623 * 1.09 = 2.1748359   0.0133653                    -0.2962703
    # 6     -1  1e-6   0.22313  A<0, r<1       10 (capped) * 1/1.03 = 9.7087379 0.9968037                   0.2224170
    # token-mean: 0.0980908 / 6 = 0.0163485;  dl/dlogp = -A g r = l (the gate is a constant)
    assert out.loss.item() == pytest.approx(0.0163485, abs=1e-6)
    expected = torch.tensor([-1.4464958, 0.7331459, -0.6065307, 1.4918247, -0.2962703, 0.2224170]) / 6
    assert torch.allclose(grad, expected, atol=1e-6)
    assert out.metrics["maspo/gated_fraction"] == pytest.approx(4 / 6)
    # mean gate: (0.8773441 + 0.9964485 + 1 + 1 + 0.0133653 + 0.9968037) / 6 = 0.8139936
    assert out.metrics["maspo/gate_mean"] == pytest.approx(0.8139936, abs=1e-6)


def test_rare_tokens_get_a_wider_gate():
    # Same A = +1 and r = 2 (so (r - 1)^2 = 1), p_old 0.5 (so p = 1) versus 0.01:
    # common: sigma = 0.5^-0.3 * 1.03 = 1.2311444 * 1.03 = 1.2680787, g = exp(-1 / (2 * 1.6080237)) = 0.7327573
    # rare:   sigma = 0.01^-0.3 * 1.03 = 3.9810717 * 1.03 = 4.1005039, g = exp(-1 / (2 * 16.8141317)) = 0.9707009
    # dl/dlogp = -A g r = -2 g
    _, common = one_row([math.log(2.0)], [1.0], MASPO, old=math.log(0.5))
    _, rare = one_row([math.log(2.0)], [1.0], MASPO, old=math.log(0.01))
    assert common.item() == pytest.approx(-2 * 0.7327573, abs=1e-5)
    assert rare.item() == pytest.approx(-2 * 0.9707009, abs=1e-5)


@pytest.mark.parametrize("alpha", [0.3, 0.5])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, alpha):
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad({"kind": "maspo", "alpha": alpha}, batch)

    def per_token(lp):  # the released code: ratio <- sg(gate) * ratio where r moved with A
        r = ratio(lp, batch)
        A, p_old = batch.advantages, torch.exp(batch.old_logprobs)
        mass = torch.clamp(1.0 / p_old**alpha, 1.0, 10.0)
        sigma_neg = mass * torch.clamp(1 / (1 - 0.03 * A), 0.1, 10.0)
        sigma_pos = mass * torch.clamp(1 + 0.03 * A, 0.1, 10.0)
        rd = r.detach()
        r = torch.where((A < 0) & (r < 1), torch.exp(-((rd - 1) ** 2) / 2 / sigma_neg**2) * r, r)
        r = torch.where((A > 0) & (r > 1), torch.exp(-((rd - 1) ** 2) / 2 / sigma_pos**2) * r, r)
        return -A * r

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)


@pytest.mark.parametrize(("fields", "name"), [({"sigma_base": 20.0}, "sigma_base"), ({"adv_low": 11.0}, "adv_low")])
def test_ranges_in_order(fields, name):
    with pytest.raises(rlstab.ConfigError, match=name):
        rlstab.load({"surrogate": {"kind": "maspo", **fields}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_preset():
    s = rlstab.load("maspo").surrogate
    assert (s.sigma_base, s.alpha, s.sigma_high, s.beta_pos, s.beta_neg, s.adv_low, s.adv_high) == (
        1.0, 0.3, 10.0, 0.03, 0.03, 0.1, 10.0
    )
