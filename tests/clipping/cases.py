"""Batches and checks shared by the surrogate tests (imported as ``clipping.cases``)."""

from __future__ import annotations

import torch

import rlstab


def one_row(log_ratios, advantages, surrogate, aggregation="token-mean", old=-1.0, entropy=None, logprobs=None):
    """One response whose tokens have the given log-ratios and advantages (old log-prob ``old``).

    ``logprobs``: the current log-probabilities instead (then ``log_ratios`` are ignored).
    Returns the loss output and the gradient of the loss with respect to the log-probabilities.
    """
    n = len(advantages)
    old_t = torch.full((1, n), float(old)) if not isinstance(old, list) else torch.tensor([old])
    current = old_t + torch.tensor([log_ratios]) if logprobs is None else torch.tensor([logprobs])
    current = current.clone().requires_grad_()
    batch = rlstab.TokenBatch(
        logprobs=current,
        old_logprobs=old_t,
        advantages=torch.tensor([advantages]),
        response_mask=torch.ones(1, n, dtype=torch.bool),
        entropy=None if entropy is None else torch.tensor([entropy]),
    )
    objective = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": aggregation, "count": "valid"}})
    out = objective.compile()(batch)
    out.loss.backward()
    return out, current.grad[0]


def off_policy_batch(seed: int, B: int = 12, T: int = 30, spread: float = 2.0) -> rlstab.TokenBatch:
    """Ragged responses, log-ratios spread over +-``spread`` (every clip branch is hit), per-token
    advantages of both signs with exact zeros, probabilities from 1e-4 to ~1, entropy."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T) < lengths[:, None]
    old = -torch.rand(B, T, generator=g).pow(2) * 9.0
    logprobs = (old + (torch.rand(B, T, generator=g) * 2 - 1) * spread).clamp(max=-1e-4)
    advantages = torch.randn(B, T, generator=g) * 1.5
    advantages[torch.rand(B, T, generator=g) < 0.1] = 0.0
    return rlstab.TokenBatch(
        logprobs=logprobs.requires_grad_(),
        old_logprobs=old,
        advantages=advantages,
        response_mask=mask,
        entropy=torch.rand(B, T, generator=g) * 3.0,
    )


def rlstab_loss_and_grad(surrogate: dict, batch: rlstab.TokenBatch, aggregation: str = "token-mean"):
    objective = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": aggregation, "count": "valid"}})
    out = objective.compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    return out, grad


def token_mean_reference(per_token, batch: rlstab.TokenBatch):
    """``(loss, grad)`` of the token mean of ``per_token(logprobs)`` over valid tokens, by autograd."""
    lp = batch.logprobs.detach().clone().requires_grad_()
    m = batch.response_mask.to(torch.float32)
    loss = (per_token(lp) * m).sum() / m.sum()
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


def ratio(lp: torch.Tensor, batch: rlstab.TokenBatch) -> torch.Tensor:
    """r = exp(clamp(log pi - log pi_old, -20, 20)), differentiable in ``lp``."""
    return torch.exp((lp - batch.old_logprobs).clamp(-20.0, 20.0))
