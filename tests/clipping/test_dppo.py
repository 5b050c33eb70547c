"""DPPO Binary-TV and Binary-KL: hand-computed masks and values, and gradients against autograd."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

P_OLD = [0.5, 0.5, 0.5, 0.001, 0.9, 0.02, 0.98]
P_NEW = [0.7, 0.6, 0.3, 0.01, 0.2, 0.1, 0.85]
ADV = [1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0]
# token  A    p_old -> p     TV move  TV (0.15) keeps   binary KL  KL (0.05) keeps      r      l = -A r log p   -A r
# 1      +1   0.5  -> 0.7    +0.2     no (up, > 0.15)   0.087177   no (up, > 0.05)      1.4    0.4993449       -1.4
# 2      +1   0.5  -> 0.6    +0.1     yes               0.020411   yes                  1.2    0.6129907       -1.2
# 3      -1   0.5  -> 0.3    -0.2     no (down)         0.087177   no (down, > 0.05)    0.6    -0.7223837      0.6
# 4      -1   0.001-> 0.01   +0.009   yes               0.006738   yes (moves up)       10     -46.0517019     10
# 5      +1   0.9  -> 0.2    -0.7     yes (moves down)  1.145726   yes (moves down)     0.2222 0.3576529       -0.2222222
# 6      +1   0.02 -> 0.1    +0.08    yes               0.051266   no (up, > 0.05)      5      11.5129255      -5
# 7      -1   0.98 -> 0.85   -0.13    yes               0.099172   no (down, > 0.05)    0.8673 -0.1409603      0.8673469
# Binary KL: p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p)), e.g. token 6: 0.02*(-1.609438) + 0.98*0.085158.


def rows(surrogate):
    return one_row(None, ADV, surrogate, logprobs=[math.log(p) for p in P_NEW], old=[math.log(p) for p in P_OLD])


def test_binary_tv_hand_computed():
    out, grad = rows({"kind": "dppo_tv"})
    # kept: 2, 4, 5, 6, 7 -> (0.6129907 - 46.0517019 + 0.3576529 + 11.5129255 - 0.1409603) / 7 = -4.8155847
    assert out.loss.item() == pytest.approx(-4.8155847, abs=2e-5)
    expected = torch.tensor([0.0, -1.2, 0.0, 10.0, -2 / 9, -5.0, 0.85 / 0.98]) / 7
    assert torch.allclose(grad, expected, atol=1e-5)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 7)  # token 1
    assert out.metrics["clip/low_fraction"] == pytest.approx(1 / 7)  # token 3


def test_binary_kl_hand_computed():
    out, grad = rows({"kind": "dppo_kl"})
    # kept: 2, 4, 5 -> (0.6129907 - 46.0517019 + 0.3576529) / 7 = -6.4401512
    assert out.loss.item() == pytest.approx(-6.4401512, abs=2e-5)
    expected = torch.tensor([0.0, -1.2, 0.0, 10.0, -2 / 9, 0.0, 0.0]) / 7
    assert torch.allclose(grad, expected, atol=1e-5)
    assert out.metrics["clip/high_fraction"] == pytest.approx(2 / 7)  # tokens 1 and 6
    assert out.metrics["clip/low_fraction"] == pytest.approx(2 / 7)  # tokens 3 and 7


def test_truncated_importance_weight():
    out, grad = rows({"kind": "dppo_tv", "is_cap": 3.0})
    # tokens 4 (r = 10) and 6 (r = 5) are kept and truncated to 3:
    # 4: -(-1) * 3 * log 0.01 = -13.8155106;  6: -1 * 3 * log 0.1 = 6.9077553
    # (0.6129907 - 13.8155106 + 0.3576529 + 6.9077553 - 0.1409603) / 7 = -0.8682960
    assert out.loss.item() == pytest.approx(-0.8682960, abs=2e-5)
    expected = torch.tensor([0.0, -1.2, 0.0, 3.0, -2 / 9, -3.0, 0.85 / 0.98]) / 7
    assert torch.allclose(grad, expected, atol=1e-5)
    assert out.metrics["clip/truncated_fraction"] == pytest.approx(2 / 7)


def test_asymmetric_bounds():
    # delta_high = 0.25 keeps token 1 (+0.2); delta_low = 0.1 now masks token 7 (-0.13)
    out, grad = rows({"kind": "dppo_tv", "delta_high": 0.25, "delta_low": 0.1})
    assert grad[0].item() == pytest.approx(-1.4 / 7, abs=1e-6)
    assert grad[6].item() == 0.0
    assert out.metrics["clip/high_fraction"] == 0.0
    assert out.metrics["clip/low_fraction"] == pytest.approx(2 / 7)


def tv_keep(lp, batch, d_low, d_high):
    move = torch.exp(lp) - torch.exp(batch.old_logprobs)
    return torch.where(batch.advantages > 0, move <= d_high, move >= -d_low).float()


def kl_keep(lp, batch, d_low, d_high):
    p, q = torch.exp(lp), torch.exp(batch.old_logprobs)
    kl = q * (batch.old_logprobs - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
    return torch.where(batch.advantages > 0, (kl <= d_high) | (p <= q), (kl <= d_low) | (p >= q)).float()


@pytest.mark.parametrize("kind", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("seed", range(4))
def test_gradient_is_the_masked_importance_weighted_policy_gradient(kind, seed):
    """Textbook DPPO: l = -M A r, differentiated by autograd (M a constant): same gradient."""
    batch = off_policy_batch(seed, spread=1.0)
    d = 0.15 if kind == "dppo_tv" else 0.05
    keep = tv_keep if kind == "dppo_tv" else kl_keep
    out, grad = rlstab_loss_and_grad({"kind": kind}, batch)
    m = keep(batch.logprobs.detach(), batch, d, d)
    assert 0 < m[batch.response_mask].mean() < 1  # both kept and masked tokens

    _, ref_grad = token_mean_reference(lambda lp: -m * batch.advantages * ratio(lp, batch), batch)
    assert torch.allclose(grad, ref_grad, atol=1e-6)


@pytest.mark.parametrize("cap", [None, 2.0])
@pytest.mark.parametrize("kind", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("seed", range(3))
def test_value_and_gradient_match_the_stop_gradient_form(kind, seed, cap):
    """l = -M A sg(min(r, C)) log p (veRL's value), by autograd."""
    batch = off_policy_batch(seed, spread=1.0)
    keep = tv_keep if kind == "dppo_tv" else kl_keep
    d = 0.15 if kind == "dppo_tv" else 0.05
    out, grad = rlstab_loss_and_grad({"kind": kind, "is_cap": cap}, batch)

    def per_token(lp):
        w = ratio(lp, batch) if cap is None else ratio(lp, batch).clamp(max=cap)
        return -keep(lp.detach(), batch, d, d) * batch.advantages * w.detach() * lp

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)


def test_presets_follow_the_authors_script():
    tv, kl = rlstab.load("dppo_tv"), rlstab.load("dppo_kl")
    assert (tv.surrogate.delta_low, tv.surrogate.delta_high, tv.surrogate.is_cap) == (0.15, 0.15, None)
    assert (kl.surrogate.delta_low, kl.surrogate.delta_high, kl.surrogate.is_cap) == (0.05, 0.05, None)
    for o in (tv, kl):
        assert not o.advantage.normalize_std
        assert o.aggregation.kind == "seq-mean-token-sum-norm"


def test_bounds_are_checked():
    with pytest.raises(rlstab.ConfigError, match="surrogate.*delta_low"):
        rlstab.load({"surrogate": {"kind": "dppo_tv", "delta_low": 0.0}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_both_sides_mask_whatever_the_advantage():
    # IPO's region: a token leaving [-0.15, +0.15] is masked in either direction. Against the table: token 5
    # (A > 0, moved down 0.7) is now masked too; token 4 (A < 0, up 0.009) stays. Kept: 2, 4, 6, 7 ->
    # (0.6129907 - 46.0517019 + 11.5129255 - 0.1409603) / 7 = -4.8666780
    out, grad = rows({"kind": "dppo_tv", "sides": "both"})
    assert out.loss.item() == pytest.approx(-4.8666780, abs=2e-5)
    expected = torch.tensor([0.0, -1.2, 0.0, 10.0, 0.0, -5.0, 0.85 / 0.98]) / 7
    assert torch.allclose(grad, expected, atol=1e-5)
    assert out.metrics["clip/high_fraction"] == pytest.approx(2 / 7)  # tokens 1 and 5 (A > 0)
    assert out.metrics["clip/low_fraction"] == pytest.approx(1 / 7)  # token 3


def test_ratio_value_is_prime_rls_and_keeps_the_gradient():
    # value: ratio reports -A r on the kept tokens: (-1.2 + 10 - 5 + 0.8673469) / 7 = 0.6667638; the gradient
    # is the one above.
    out, grad = rows({"kind": "dppo_tv", "sides": "both", "value": "ratio"})
    assert out.loss.item() == pytest.approx(0.6667638, abs=2e-6)
    expected = torch.tensor([0.0, -1.2, 0.0, 10.0, 0.0, -5.0, 0.85 / 0.98]) / 7
    assert torch.allclose(grad, expected, atol=1e-5)
    with pytest.raises(rlstab.ConfigError, match="value: ratio needs is_cap: null"):
        rlstab.load({"surrogate": {"kind": "dppo_tv", "value": "ratio", "is_cap": 3.0},
                     "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_new_options_at_their_defaults_leave_the_dump_unchanged():
    # Fingerprints are taken from the dump: an objective written before sides and value existed keeps its own.
    assert rlstab.load("dppo_tv").surrogate.model_dump() == {"kind": "dppo_tv", "delta_low": 0.15, "delta_high": 0.15,
                                                            "is_cap": None}
    assert rlstab.load("ipo").surrogate.model_dump()["sides"] == "both"
