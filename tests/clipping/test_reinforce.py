"""REINFORCE (GPG's loss, veRL's bypass-mode reinforce): hand-computed values, and the closed form against autograd."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, rlstab_loss_and_grad, token_mean_reference

import rlstab

PLAIN = {"kind": "reinforce"}


def test_hand_computed_plain():
    out, grad = one_row([2.0, 0.0, -0.5], [1.0, -2.0, 0.5], PLAIN, old=-3.0)
    # log p = -3 + log r = [-1, -3, -3.5];  l = -A log p = [1, -6, 1.75];  token-mean: (1 - 6 + 1.75) / 3 = -1.083333
    assert out.loss.item() == pytest.approx(-3.25 / 3, abs=1e-6)
    # dl/dlogp = -A / 3, whatever the ratio (no ratio, no clip)
    assert torch.allclose(grad, torch.tensor([-1.0, 2.0, -0.5]) / 3, atol=1e-7)
    assert "clip/high_fraction" not in out.metrics


def test_hand_computed_token_weight():
    out, grad = one_row([1.0, 0.0, -0.5], [1.0, -2.0, 0.5], {"kind": "reinforce", "is_weight": "token", "is_cap": 2.0},
                        old=-3.0)
    # r = [e, 1, e^-0.5] = [2.71828, 1, 0.60653];  w = min(r, 2) = [2, 1, 0.60653];  log p = [-2, -3, -3.5]
    # l = -w A log p = [-2*1*(-2), -1*(-2)*(-3), -0.60653*0.5*(-3.5)] = [4, -6, 1.06143]; mean = -0.312857
    assert out.loss.item() == pytest.approx((4 - 6 + 0.5 * 3.5 * math.exp(-0.5)) / 3, abs=1e-6)
    # dl/dlogp = -w A / 3 = [-2, 2, -0.30327] / 3: the truncated token keeps its gradient
    assert torch.allclose(grad, torch.tensor([-2.0, 2.0, -0.5 * math.exp(-0.5)]) / 3, atol=1e-7)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 3)  # r = e > 2


def test_hand_computed_sequence_weight():
    out, grad = one_row([0.3, 0.2, -0.1], [1.0, 1.0, 1.0], {"kind": "reinforce", "is_weight": "sequence"}, old=-1.0)
    # prod r = exp(0.3 + 0.2 - 0.1) = exp(0.4) = 1.49182 < 2: one weight for the response
    w = math.exp(0.4)
    # log p = [-0.7, -0.8, -1.1];  l = -w log p;  token-mean = w * 2.6 / 3
    assert out.loss.item() == pytest.approx(w * 2.6 / 3, abs=1e-6)
    assert torch.allclose(grad, torch.full((3,), -w / 3), atol=1e-7)
    assert out.metrics["clip/high_fraction"] == 0.0
    out, _ = one_row([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], {"kind": "reinforce", "is_weight": "sequence"}, old=-1.0)
    assert out.metrics["clip/high_fraction"] == 1.0  # exp(1.5) = 4.48 > 2: every token of the response truncated


def test_sequence_weight_sums_the_unclamped_log_ratios():
    # sum = 30 - 15 = 15: inside +-20, w = min(e^15, 1e9) = e^15, although one token's log-ratio is above 20
    _, grad = one_row([30.0, -15.0], [1.0, 0.0], {"kind": "reinforce", "is_weight": "sequence", "is_cap": 1e6},
                      old=-40.0)
    assert grad[0].item() == pytest.approx(-1e6 / 2)  # e^15 = 3.27e6 > cap 1e6


@pytest.mark.parametrize("is_weight", ["none", "token", "sequence"])
@pytest.mark.parametrize("seed", range(3))
def test_closed_form_gradient_matches_autograd(seed, is_weight):
    batch = off_policy_batch(seed)
    cap = 1.5
    out, grad = rlstab_loss_and_grad({"kind": "reinforce", "is_weight": is_weight, "is_cap": cap}, batch)
    m = batch.response_mask

    def per_token(lp):  # -sg(w) A log p
        log_ratio = torch.where(m, lp - batch.old_logprobs, 0.0)
        if is_weight == "none":
            w = torch.ones_like(lp)
        elif is_weight == "token":
            w = log_ratio.clamp(-20, 20).exp().clamp(max=cap)
        else:
            w = log_ratio.sum(-1, keepdim=True).clamp(-20, 20).exp().clamp(max=cap)
        return -w.detach() * batch.advantages * lp

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)


def test_token_weight_is_cispo_without_lower_bound():
    batch = off_policy_batch(7)
    ours = rlstab_loss_and_grad({"kind": "reinforce", "is_weight": "token", "is_cap": 3.0}, batch)
    cispo = rlstab_loss_and_grad({"kind": "cispo", "min_weight": 0.0, "max_weight": 3.0}, batch)
    assert ours[0].loss.item() == pytest.approx(cispo[0].loss.item(), abs=1e-6)
    assert torch.allclose(ours[1], cispo[1], atol=1e-7)
    assert ours[0].metrics["clip/high_fraction"] == pytest.approx(cispo[0].metrics["clip/high_fraction"])


def test_padding_with_huge_values_stays_finite():
    lp = torch.tensor([[-1.0, 1e30], [-2.0, -0.5]]).requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=torch.tensor([[-1.0, -1e30], [-2.5, -0.5]]),
                              advantages=torch.tensor([1.0, -1.0]), response_mask=torch.tensor([[True, False], [True, True]]))
    for is_weight in ("none", "token", "sequence"):
        objective = rlstab.load({"surrogate": {"kind": "reinforce", "is_weight": is_weight},
                                 "aggregation": {"kind": "token-mean", "count": "valid"}})
        out = objective.compile()(batch)
        (grad,) = torch.autograd.grad(out.loss, lp)
        assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
        assert grad[0, 1] == 0.0


def test_cap_is_checked():
    with pytest.raises(rlstab.ConfigError, match="surrogate.*is_cap"):
        rlstab.load({"surrogate": {"kind": "reinforce", "is_cap": 0.0}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_describe():
    assert rlstab.load({"surrogate": PLAIN, "aggregation": {"kind": "token-mean", "count": "valid"}}).surrogate.describe() == (
        "reinforce: l = -A log p (no ratio, no clipping)")
    assert "min(prod_t r, 2)" in rlstab.load({"surrogate": {"kind": "reinforce", "is_weight": "sequence"},
                                              "aggregation": {"kind": "token-mean", "count": "valid"}}).surrogate.describe()
