"""PPO clip, clip-higher and dual-clip: hand-computed values, and closed-form gradients against autograd."""

import math

import pytest
import torch

import rlstab


def one_row(ratios, advantages, surrogate, old=-2.0):
    """One response whose tokens have the given ratios and advantages; token-mean over its tokens. The old
    log-probs are ``old``, low enough that every log-prob ``old + log r`` is at most 0."""
    old = torch.full((1, len(ratios)), old)
    logprobs = (old + torch.tensor([ratios]).log()).requires_grad_()
    batch = rlstab.TokenBatch(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=torch.tensor([advantages]),
        response_mask=torch.ones(1, len(ratios), dtype=torch.bool),
    )
    objective = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": "token-mean", "count": "valid"}})
    out = objective.compile()(batch)
    out.loss.backward()
    return out, logprobs.grad[0]


RATIOS = [5.0, 1.5, 1.1, 0.5, 2.0]
ADVANTAGES = [-1.0, 1.0, 1.0, -1.0, -1.0]


def test_dual_clip_hand_computed():
    out, grad = one_row(RATIOS, ADVANTAGES, {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0})
    # token: l = ...                                  dl/dlogp
    # A=-1 r=5:   min(-A max(r, 0.8), -3A) = 3          0 (dual-clipped)
    # A=+1 r=1.5: -A min(r, 1.28) = -1.28               0 (clipped high)
    # A=+1 r=1.1: -1.1                                  -A r = -1.1
    # A=-1 r=0.5: -A max(r, 0.8) = 0.8                  0 (clipped low)
    # A=-1 r=2:   min(2, 3) = 2                         -A r = 2
    assert out.loss.item() == pytest.approx((3 - 1.28 - 1.1 + 0.8 + 2) / 5)
    assert torch.allclose(grad, torch.tensor([0.0, 0.0, -1.1, 0.0, 2.0]) / 5, atol=1e-6)
    assert out.metrics["clip/dual_fraction"] == pytest.approx(0.2)
    assert out.metrics["clip/high_fraction"] == pytest.approx(0.2)
    assert out.metrics["clip/low_fraction"] == pytest.approx(0.2)


def test_without_dual_clip_the_negative_loss_is_unbounded():
    out, grad = one_row(RATIOS, ADVANTAGES, {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28})
    # First token now l = -A r = 5 with gradient -A r = 5.
    assert out.loss.item() == pytest.approx((5 - 1.28 - 1.1 + 0.8 + 2) / 5)
    assert grad[0].item() == pytest.approx(5 / 5)
    assert "clip/dual_fraction" not in out.metrics


def test_no_clip_is_importance_weighted_pg():
    out, grad = one_row(RATIOS, ADVANTAGES, {"kind": "none"})
    values = [-a * r for a, r in zip(ADVANTAGES, RATIOS)]
    assert out.loss.item() == pytest.approx(sum(values) / 5)
    assert torch.allclose(grad, torch.tensor(values) / 5, atol=1e-6)


def test_log_ratio_is_clamped_before_exp():
    # log r = 30 is clamped to 20: the loss is finite and the clamp has zero gradient.
    out, grad = one_row([math.exp(30.0)], [-1.0], {"kind": "none"}, old=-31.0)
    assert out.loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert grad[0].item() == 0.0


def test_dual_clip_must_exceed_the_clip_range():
    with pytest.raises(rlstab.ConfigError, match="surrogate"):
        rlstab.load({"surrogate": {"kind": "ppo_clip", "eps_high": 0.28, "dual_clip": 1.2}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def reference_ppo(logprobs, old, adv, mask, eps_low, eps_high, c):
    """PPO clip with dual-clip written the textbook way, through autograd."""
    ratio = torch.exp((logprobs - old).clamp(-20, 20))
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    clipped = torch.maximum(l1, l2)
    if c is not None:
        clipped = torch.where(adv < 0, torch.minimum(clipped, -adv * c), clipped)
    m = mask.float()
    return (clipped * m).sum() / m.sum()


@pytest.mark.parametrize("dual_clip", [None, 3.0, 10.0])
@pytest.mark.parametrize("seed", range(5))
def test_closed_form_gradient_matches_autograd(seed, dual_clip, make_batch):
    batch = make_batch(B=12, T=30, seed=seed, advantages="token")
    # Spread the ratios so that every clip branch is hit.
    old = (batch.logprobs.detach() + torch.randn(12, 30, generator=torch.Generator().manual_seed(seed))).abs().neg()
    batch = rlstab.TokenBatch(logprobs=batch.logprobs, old_logprobs=old, advantages=batch.advantages,
                              response_mask=batch.response_mask)
    surrogate = {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "dual_clip": dual_clip}
    out = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": "token-mean", "count": "valid"}}).compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    lp = batch.logprobs.detach().clone().requires_grad_()
    ref = reference_ppo(lp, old, batch.advantages, batch.response_mask, 0.2, 0.28, dual_clip)
    (ref_grad,) = torch.autograd.grad(ref, lp)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert out.metrics["clip/high_fraction"] + out.metrics["clip/low_fraction"] > 0


def test_delta_above_the_clip_range_is_dual_clip():
    """TRL's delta = 3 > 1 + eps_high gives exactly dual_clip = 3 (same values as test_dual_clip_hand_computed)."""
    out, grad = one_row(RATIOS, ADVANTAGES, {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "delta": 3.0})
    dual, dual_grad = one_row(RATIOS, ADVANTAGES, {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0})
    assert out.loss.item() == pytest.approx((3 - 1.28 - 1.1 + 0.8 + 2) / 5)
    assert torch.allclose(grad, dual_grad, atol=1e-7)
    assert out.metrics == pytest.approx(dual.metrics)


def test_delta_below_the_clip_range_hand_computed():
    """delta = 1.05 < 1 + eps_high: l = max(-A min(r, 1.05), -A clip(r, 0.8, 1.28)) as TRL computes it."""
    out, grad = one_row(RATIOS, ADVANTAGES, {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "delta": 1.05})
    # token: -min(A min(r, 1.05), A clip(r))           dl/dlogp
    # A=-1 r=5:   max(1.05, 1.28) = 1.28                  0 (clip(r) = 1.28 is constant)
    # A=+1 r=1.5: -min(1.05, 1.28) = -1.05                0
    # A=+1 r=1.1: -min(1.05, 1.1) = -1.05                 0 (now capped by delta)
    # A=-1 r=0.5: max(0.5, 0.8) = 0.8                     0
    # A=-1 r=2:   max(1.05, 1.28) = 1.28                  0
    assert out.loss.item() == pytest.approx((1.28 - 1.05 - 1.05 + 0.8 + 1.28) / 5)
    assert torch.allclose(grad, torch.zeros(5), atol=1e-7)


@pytest.mark.parametrize("delta", [0.5, 1.05, 1.2, 1.28, 2.0, 4.0])
def test_delta_gradient_matches_autograd_of_trls_formula(delta):
    torch.manual_seed(0)
    B, T = 5, 9
    old = torch.randn(B, T) - 4.0  # log-probs at most 0
    logprobs = (old + 0.7 * torch.randn(B, T)).requires_grad_()
    adv = torch.randn(B)
    mask = torch.arange(T) < torch.tensor([0, 3, 9, 5, 7]).unsqueeze(-1)
    batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=mask)
    objective = rlstab.load({"surrogate": {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "delta": delta},
                             "aggregation": {"kind": "token-mean", "count": "valid"}})
    out = objective.compile()(batch)
    out.loss.backward()
    ours = logprobs.grad.clone()
    logprobs.grad = None
    # TRL 1.16 _compute_loss: coef_2 = clamp(coef_1, 1-e, 1+eh); coef_1 = clamp(coef_1, max=delta); -min(c1 A, c2 A)
    coef_1 = torch.exp(logprobs - old)
    coef_2 = torch.clamp(coef_1, 0.8, 1.28)
    coef_1 = torch.clamp(coef_1, max=delta)
    a = adv.unsqueeze(-1)
    ref = (-torch.min(coef_1 * a, coef_2 * a) * mask).sum() / mask.sum()
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(ours, logprobs.grad, rtol=1e-6, atol=1e-7)


def test_delta_and_dual_clip_are_one_or_the_other():
    with pytest.raises(rlstab.ConfigError, match="set one"):
        rlstab.load({"extends": "grpo", "surrogate": {"delta": 4.0}})  # grpo has dual_clip 3
    objective = rlstab.load({"extends": "grpo", "surrogate": {"dual_clip": None, "delta": 4.0}})
    assert "two-sided clip, delta" in objective.surrogate.describe()
