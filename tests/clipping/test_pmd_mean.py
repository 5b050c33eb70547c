"""PMD-mean: a hand-computed response, and prime-rl's ``pmd_mean`` loss restated from its formula (pull request
3381; issue 41: ``sg(Ā/τ - Σ log r) ∇log π``), per sample then divided by the step's loss tokens, value and
gradient to 1e-6."""

import pytest
import torch

import rlstab

AGG = {"kind": "token-mean", "count": "valid"}


def run(loss_fn, batch):
    out = loss_fn(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    return out, grad


def test_hand_computed_response():
    # Two tokens, log p = (-0.2, -0.5), log p_old = (-0.4, -0.4): sum_t log r = 0.2 - 0.1 = 0.1.
    # Advantages (0.02, 0.04): mean 0.03; tau = 0.01 -> target log-ratio 3, c = 3 - 0.1 = 2.9.
    logprobs = torch.tensor([[-0.2, -0.5]], requires_grad=True)
    batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=torch.full((1, 2), -0.4),
                              advantages=torch.tensor([[0.02, 0.04]]), response_mask=torch.ones(1, 2, dtype=torch.bool))
    loss_fn = rlstab.load({"surrogate": {"kind": "pmd_mean", "tau": 0.01}, "aggregation": AGG}).compile()
    out, grad = run(loss_fn, batch)
    # token-mean over 2 tokens: loss = (-2.9 * -0.2 - 2.9 * -0.5) / 2 = 2.9 * 0.7 / 2 = 1.015
    assert out.loss.item() == pytest.approx(1.015, abs=1e-6)
    # d/dlog p_t = -c / 2 = -1.45 on both tokens
    assert torch.allclose(grad, torch.full((1, 2), -1.45), atol=1e-6)


def test_a_response_at_its_target_gets_no_gradient():
    # sum_t log r = 0.3 = A / tau with A = 0.003, tau = 0.01: c = 0
    logprobs = torch.tensor([[-0.1, -0.2]], requires_grad=True)
    batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=torch.tensor([[-0.2, -0.4]]),
                              advantages=torch.tensor([0.003]), response_mask=torch.ones(1, 2, dtype=torch.bool))
    loss_fn = rlstab.load({"surrogate": {"kind": "pmd_mean", "tau": 0.01}, "aggregation": AGG}).compile()
    _, grad = run(loss_fn, batch)
    assert torch.allclose(grad, torch.zeros(1, 2), atol=1e-6)


def prime_rl_pmd_mean(trainer_logprobs, inference_logprobs, advantages, loss_mask, tau):
    """prime-rl's per-sample loss, restated: c = sg(mean advantage over the loss mask / tau - sum of the
    log-ratios over it), loss = sum_t mask * (-c * log pi); ``compute_loss`` sums the samples and divides by
    the step's loss-token count (``rl_scale``)."""
    total = 0.0
    for lp, inf, adv, mask in zip(trainer_logprobs, inference_logprobs, advantages, loss_mask):
        m = mask.to(lp.dtype)
        mean_adv = (adv * m).sum() / m.sum().clamp(min=1)
        seq_log_ratio = ((lp - inf) * m).sum()
        c = (mean_adv / tau - seq_log_ratio).detach()
        total = total + (m * (-c * lp)).sum()
    return total / loss_mask.sum()


@pytest.mark.parametrize("tau", [0.01, 0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_equals_prime_rls_formula(seed, tau):
    g = torch.Generator().manual_seed(seed)
    B, T = 10, 14
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    mask[3] = False  # a padding row
    inference = -torch.rand(B, T, generator=g) * 3.0
    logprobs = (inference + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-1e-4)
    advantages = torch.randn(B, T, generator=g) * 0.05  # per token, as prime-rl hands them
    ref_lp = logprobs.clone().requires_grad_()
    ref = prime_rl_pmd_mean(ref_lp, inference, advantages, mask, tau)
    (ref_grad,) = torch.autograd.grad(ref, ref_lp)
    data = rlstab.load("pmd_mean").model_dump()
    data["surrogate"]["tau"] = tau
    lp = logprobs.clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=inference, advantages=advantages, response_mask=mask)
    out, grad = run(rlstab.load(data).compile(), batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6, rel=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6, rtol=1e-6)
    # per-response advantages: the same as per-token constant ones
    per_response = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    ref_lp = logprobs.clone().requires_grad_()
    ref = prime_rl_pmd_mean(ref_lp, inference, per_response[:, None].expand(B, T), mask, tau)
    (ref_grad,) = torch.autograd.grad(ref, ref_lp)
    lp = logprobs.clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=inference, advantages=per_response, response_mask=mask)
    out, grad = run(rlstab.load(data).compile(), batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6, rel=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6, rtol=1e-6)
