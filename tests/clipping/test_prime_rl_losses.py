"""The ipo and kimi_k25 presets against prime-rl's loss functions, restated from its code (loss and gradient).

prime-rl has no old-policy pass: its ratio is pi_theta / pi_infer. The presets read it in bypass mode, the
inference engine's log-probabilities handed as ``old_logprobs``; both references read them from there too.
"""

import pytest
import torch

import rlstab


def bypass_batch(make_batch, seed, spread):
    """A random batch with per-response advantages whose ``old_logprobs`` (the sampler's) lie ``spread`` away."""
    batch = make_batch(B=12, T=16, seed=seed, advantages="sequence")
    g = torch.Generator().manual_seed(seed)
    infer = (batch.logprobs.detach() + spread * torch.randn(batch.logprobs.shape, generator=g)).clamp(max=-1e-6)
    return rlstab.TokenBatch(logprobs=batch.logprobs, old_logprobs=infer, advantages=batch.advantages,
                             response_mask=batch.response_mask)


def prime_rl_ipo(batch, threshold=0.1, kl_tau=1e-3, adv_tau=1.0, advantage_side=None):
    """prime-rl's ``ipo_loss_fn`` (``src/prime_rl/trainer/rl/loss.py``, PR #2798; ``IPOLossConfig`` defaults), restated.

    keep = loss_mask & |p - p_infer| <= threshold; per token -keep A r + kl_tau (log r)^2 on the loss mask; summed,
    then ``compute_loss`` divides by the step's count of trainable tokens (``rl_scale``). With ``advantage_side``
    = (low, high), its ``default_loss_fn``: masked where p - p_infer > high for A > 0, < -low otherwise.
    """
    lp = batch.logprobs.detach().clone().requires_grad_()
    mask, infer = batch.response_mask, batch.old_logprobs
    adv = adv_tau * batch.advantages.unsqueeze(-1).expand_as(lp)
    log_r = lp - infer
    r = torch.exp(log_r)
    diff = torch.exp(lp) - torch.exp(infer)
    if advantage_side is None:
        masked = diff.abs() > threshold
    else:
        low, high = advantage_side
        masked = torch.where(adv > 0, diff > high, diff < -low)
    keep = mask & ~masked
    per_token = -torch.where(keep, adv * r, 0.0) + kl_tau * torch.where(mask, log_r**2, 0.0)
    loss = per_token.sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, keep


def prime_rl_kimi_k25(batch, low=0.125, high=8.0, kl_tau=1e-3):
    """prime-rl's Kimi K2.5 loss (PR #1697, ``compute_loss`` in ``src/prime_rl/trainer/rl/loss.py``), restated.

    keep = loss_mask & r in [low, high] (``token_mask_low/high``); pg = -sum_keep sg(r A) log p;
    kl = sum_mask (log r)^2; (pg + kl_tau kl) / the step's trainable tokens. prime-rl's own geo-mean band
    [0.1, 10] and per-response max 100 (not in K2.5's eq. 1) are checked not to fire on these batches.
    """
    lp = batch.logprobs.detach().clone().requires_grad_()
    mask, infer = batch.response_mask, batch.old_logprobs
    adv = batch.advantages.unsqueeze(-1).expand_as(lp)
    log_r = lp - infer
    r = torch.exp(log_r)
    geo = torch.exp(torch.where(mask, log_r, 0.0).sum(-1) / mask.sum(-1))
    assert ((geo >= 0.1) & (geo <= 10)).all() and (torch.where(mask, r, 0.0).amax(-1) <= 100).all()
    keep = mask & (r >= low) & (r <= high)
    pg = -torch.where(keep, (r * adv).detach() * lp, 0.0).sum()
    kl = torch.where(mask, log_r**2, 0.0).sum()
    loss = (pg + kl_tau * kl) / mask.sum()
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, keep


@pytest.mark.parametrize("seed", range(5))
def test_ipo_preset_matches_prime_rl(make_batch, seed):
    batch = bypass_batch(make_batch, seed, spread=0.5)
    out = rlstab.load("ipo").compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    ref, ref_grad, keep = prime_rl_ipo(batch)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert 0 < keep.sum() < batch.response_mask.sum()  # the 0.1 band silences some tokens, not all


@pytest.mark.parametrize("seed", range(3))
def test_default_loss_matches_prime_rl(make_batch, seed):
    batch = bypass_batch(make_batch, seed, spread=0.5)
    objective = {"extends": "ipo", "surrogate": {"sides": "advantage", "delta_low": 0.2, "delta_high": 0.2}}
    out = rlstab.load(objective).compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    ref, ref_grad, keep = prime_rl_ipo(batch, advantage_side=(0.2, 0.2))
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert 0 < keep.sum() < batch.response_mask.sum()


@pytest.mark.parametrize("seed", range(5))
def test_kimi_k25_preset_matches_prime_rl(make_batch, seed):
    batch = bypass_batch(make_batch, seed, spread=1.5)
    out = rlstab.load("kimi_k25").compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    ref, ref_grad, keep = prime_rl_kimi_k25(batch)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert 0 < keep.sum() < batch.response_mask.sum()  # the [0.125, 8] band silences some tokens, not all


def test_ipo_by_hand():
    # One response, A = 1, three tokens (p, p_infer): (0.5, 0.45) moves 0.05, kept, r = 10/9;
    # (0.5, 0.3) moves 0.2 up, silenced; (0.2, 0.4) moves 0.2 down, silenced although A > 0 (both sides).
    # Loss = [-(10/9) + 1e-3 ((ln 10/9)^2 + (ln 5/3)^2 + (ln 1/2)^2)] / 3
    #      = [-1.111111 + 1e-3 (0.011101 + 0.260943 + 0.480453)] / 3 = -0.3701195
    # d/dlog p: kept -r/3 = -0.370370 plus the KL's 2e-3 ln r / 3 on every token.
    p = torch.tensor([[0.5, 0.5, 0.2]]).log().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=p, old_logprobs=torch.tensor([[0.45, 0.3, 0.4]]).log(),
                              advantages=torch.tensor([1.0]), response_mask=torch.ones(1, 3, dtype=torch.bool))
    out = rlstab.load("ipo").compile()(batch)
    assert out.loss.item() == pytest.approx(-0.3701195, abs=1e-6)
    (grad,) = torch.autograd.grad(out.loss, p)
    log_r = torch.tensor([10 / 9, 5 / 3, 0.5]).log()
    expected = torch.tensor([-10 / 9, 0.0, 0.0]) / 3 + 2e-3 * log_r / 3
    assert torch.allclose(grad[0], expected, atol=1e-7)
