"""The kpop preset: hand-computed, and AReaL's KPop loss (the authors' implementation) restated from its code."""

import pytest
import torch
from masks.test_rollout import probabilities_batch

import rlstab


def test_kpop_preset_weights_kept_tokens_and_keeps_rejected_ones_in_the_denominator():
    # kpop: decoupled PPO (r = 1 on-policy, A = 1: l = -w), w = p/q untruncated, binary KL <= 2 kept, token-mean over
    # every valid token. Tokens: (p, q) = (0.02, 0.01): w = 2, D ~ 0.004, kept; (1.0, 1e-9): D_B(p||q) with p clamped
    # to 1 - 1e-8 = ln(1e9) - ... ~ 20.7 > 2: rejected; (0.5, 0.25): D_B(p||q) = 0.5 ln 2 + 0.5 ln(0.5/0.75) = 0.1438,
    # D_B(q||p) = 0.25 ln 0.5 + 0.75 ln 1.5 = 0.1308: kept, w = 2. Loss = -(2 + 2) / 3.
    batch = probabilities_batch([[0.02, 1.0, 0.5]], [[0.01, 1e-9, 0.25]])
    out = rlstab.load("kpop").compile()(batch)
    assert out.loss.item() == pytest.approx(-4 / 3, rel=1e-6)
    assert out.metrics["tokens/valid"] == 3


def areal_kpop_loss(batch, upper=2.0, eps=0.2, floor=1e-8):
    """AReaL's ppo_actor_loss_fn with rejection_sampling (level token, action mask, metric binary_kl), restated.

    Read from areal-project/AReaL ``areal/utils/functional/functional.py`` (``apply_rejection_sampling``,
    ``compute_binary_kl_divergence``, ``ppo_actor_loss_fn``): the metric is the larger of the two binary
    KLs between pi_prox (the batch's old_logprobs) and pi_behave (rollout_logprobs), probabilities clamped
    to [1e-8, 1 - 1e-8]; a token above ``upper`` leaves the loss mask; the kept tokens' clipped loss is
    weighted by exp(log pi_prox - log pi_behave), untruncated; the sum is divided by the count of the
    loss mask *before* the rejection.
    """
    lp = batch.logprobs.detach().clone().requires_grad_()
    mask, adv = batch.response_mask, batch.advantages
    prox, behave = batch.old_logprobs, batch.rollout_logprobs

    def d_b(log_a, log_b):
        a, b = log_a.exp().clamp(floor, 1 - floor), log_b.exp().clamp(floor, 1 - floor)
        return a * torch.log(a / b) + (1 - a) * torch.log((1 - a) / (1 - b))

    kept = mask & (torch.maximum(d_b(prox, behave), d_b(behave, prox)) <= upper)
    u = torch.where(mask, torch.exp(lp - prox), 0.0)
    pg = torch.max(-adv * u, -adv * u.clamp(1 - eps, 1 + eps)) * torch.exp(prox - behave)
    loss = torch.where(kept, pg, 0.0).sum() / mask.count_nonzero()
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, kept


@pytest.mark.parametrize("seed", range(5))
def test_kpop_preset_matches_areal_on_random_batches(make_batch, seed):
    batch = make_batch(B=12, T=16, seed=seed, advantages="token")
    # an inference engine far from the trainer, and some confident tokens (log-prob near 0), so that phi = 2 binds
    g = torch.Generator().manual_seed(seed)
    old = torch.where(torch.rand(batch.old_logprobs.shape, generator=g) < 0.3, -1e-4, batch.old_logprobs)
    rollout = (old + 4.0 * torch.randn(old.shape, generator=g)).clamp(max=-1e-6)
    batch = rlstab.TokenBatch(logprobs=batch.logprobs, old_logprobs=old, rollout_logprobs=rollout,
                              advantages=batch.advantages, response_mask=batch.response_mask)
    out = rlstab.load("kpop").compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    ref, ref_grad, kept = areal_kpop_loss(batch)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert 0 < kept.sum() < batch.response_mask.sum()  # phi rejects some tokens, not all
