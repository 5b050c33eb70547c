"""Target PO: a hand-computed group, and the paper's loss (arXiv 2604.06159, eqs. 1-3, appendix A) restated
from its formula with autograd, value and gradient to 1e-6, under any micro-batching.

There is no runnable reference: TRL 1.16's ``trl.experimental.tpo`` is Triple Preference Optimization, and
TRL's TargetPO trainer (pull request 5591) was not merged. The references below restate the authors' code
(``JeanKaddour/tpo``: ``tpo_skill``, ``tpo_target``, ``make_tpo_step``'s ``loss_fn``) and the pull request's
length-normalised variant from their formulas.
"""

import math

import pytest
import torch

import rlstab

AGG = {"kind": "seq-mean-token-mean", "count": "valid"}


def objective(**surrogate):
    return rlstab.load({"surrogate": {"kind": "target_po", **surrogate}, "aggregation": AGG})


def run(loss_fn, batch, step=None):
    out = loss_fn(batch, step=step)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    return out, grad


def test_hand_computed_group_of_two():
    # One group of two responses of two tokens. Current log-probs: response 0 (-0.1, -0.2), response 1 (-0.7, -0.3):
    # l = (-0.3, -1.0); old log-probs: l_old = (-0.5, -0.5); advantages (u) = (+1, -1), eta = 1.
    logprobs = torch.tensor([[-0.1, -0.2], [-0.7, -0.3]], requires_grad=True)
    batch = rlstab.TokenBatch(
        logprobs=logprobs,
        old_logprobs=torch.full((2, 2), -0.25),
        advantages=torch.tensor([1.0, -1.0]),
        response_mask=torch.ones(2, 2, dtype=torch.bool),
        group_ids=torch.tensor([7, 7]),
    )
    out, grad = run(objective().compile(), batch)
    # p = softmax(-0.3, -1.0): p0 = 1 / (1 + e^-0.7) = 0.668188, p1 = 0.331812
    p0 = 1 / (1 + math.exp(-0.7))
    p1 = 1 - p0
    # q = softmax(l_old + u) = softmax(0.5, -1.5): q0 = 1 / (1 + e^-2) = 0.880797, q1 = 0.119203
    q0 = 1 / (1 + math.exp(-2.0))
    q1 = 1 - q0
    # loss = -(q0 log p0 + q1 log p1); seq-mean-token-mean with S = 2 responses: W_i = 1/2, K = 2 -> weight 1
    loss = -(q0 * math.log(p0) + q1 * math.log(p1))  # = 0.880797 * 0.403186 + 0.119203 * 1.103186 = 0.486638
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    # gradient on every token of response i: K W_i (p_i - q_i) = p_i - q_i = (-0.212609, +0.212609)
    expected = torch.tensor([[p0 - q0, p0 - q0], [p1 - q1, p1 - q1]])
    assert torch.allclose(grad, expected, atol=1e-6)


def test_gradient_vanishes_at_the_target():
    # On-policy (l = l_old) with equal advantages in the group: q = p_old = p, no gradient (a group of equal
    # rewards trains nothing on the rollout's snapshot, section 4.2).
    logprobs = torch.tensor([[-0.1, -0.2], [-0.7, -0.3], [-1.0, -0.4]], requires_grad=True)
    batch = rlstab.TokenBatch(
        logprobs=logprobs, old_logprobs=logprobs.detach(), advantages=torch.zeros(3),
        response_mask=torch.ones(3, 2, dtype=torch.bool), group_ids=torch.tensor([0, 0, 0]),
    )
    _, grad = run(objective().compile(), batch)
    assert torch.allclose(grad, torch.zeros(3, 2), atol=1e-7)


def tpo_skill(scores):
    """The authors' standardisation restated: population std, undivided where it is at most 1e-6."""
    centred = scores - scores.mean(-1, keepdim=True)
    std = centred.pow(2).mean(-1, keepdim=True).sqrt()
    return torch.where(std > 1e-6, centred / torch.where(std > 1e-6, std, 1.0), centred)


def paper_loss(logprobs, old_logprobs, mask, rewards, groups, k, eta=1.0, length="sum"):
    """Eqs. 1-3 over [G, K] groups (rows ordered group by group), the mean over groups (authors' ``loss_fn``).
    ``length: mean``: TRL's length-normalised log-likelihood; its loss sum(q log p) * K / numel is the same mean."""
    m = mask.to(logprobs.dtype)
    n = m.sum(-1).clamp(min=1)
    ell = (logprobs * m).sum(-1)
    ell_old = (old_logprobs * m).sum(-1)
    if length == "mean":
        ell, ell_old = ell / n, ell_old / n
    u = tpo_skill(rewards.reshape(groups, k))
    q = torch.softmax(torch.log_softmax(ell_old.reshape(groups, k), -1) + u / eta, -1).detach()
    log_p = torch.log_softmax(ell.reshape(groups, k), -1)
    return -(q * log_p).sum(-1).mean()


def grouped_batch(seed, groups=4, k=4, T=9):
    g = torch.Generator().manual_seed(seed)
    B = groups * k
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    old = -torch.rand(B, T, generator=g) * 2.0
    logprobs = (old + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-1e-4)
    rewards = torch.randint(0, 3, (B,), generator=g).float()
    rewards[:k] = 1.0  # a group of equal rewards: u = 0, its target is p_old
    return logprobs, old, mask, rewards, torch.arange(groups).repeat_interleave(k)


@pytest.mark.parametrize(("eta", "length"), [(1.0, "sum"), (0.5, "mean")])
@pytest.mark.parametrize("seed", [0, 1])
def test_preset_equals_the_papers_loss_value_and_gradient(seed, eta, length):
    logprobs, old, mask, rewards, group_ids = grouped_batch(seed)
    ref_lp = logprobs.clone().requires_grad_()
    ref = paper_loss(ref_lp, old, mask, rewards, 4, 4, eta, length)
    (ref_grad,) = torch.autograd.grad(ref, ref_lp)
    data = rlstab.load("target_po").model_dump()
    data["surrogate"].update(eta=eta, length=length)
    loss_fn = rlstab.load(data).compile()
    # rows shuffled: the groups need not be contiguous
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(seed + 10))
    lp = logprobs[perm].clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=old[perm], response_mask=mask[perm], rewards=rewards[perm],
                              group_ids=group_ids[perm])
    out, grad = run(loss_fn, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad[perm] * mask[perm], atol=1e-6)
    # the same over three uneven micro-batches that split every group, gathered as one step
    parts = [(0, 5), (5, 6), (6, 16)]

    def micro(lo, hi, logprobs):
        return rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old[perm][lo:hi], response_mask=mask[perm][lo:hi],
                                 rewards=rewards[perm][lo:hi], group_ids=group_ids[perm][lo:hi])

    stats = loss_fn.gather([micro(lo, hi, logprobs[perm][lo:hi]) for lo, hi in parts])
    total, grads = 0.0, []
    for lo, hi in parts:
        lp_part = logprobs[perm][lo:hi].clone().requires_grad_()
        out_part, g_part = run(loss_fn, micro(lo, hi, lp_part), step=stats)
        total += out_part.loss.item()
        grads.append(g_part)
    assert total == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(torch.cat(grads), ref_grad[perm] * mask[perm], atol=1e-6)


def test_a_group_missing_from_the_step_is_refused():
    logprobs, old, mask, rewards, group_ids = grouped_batch(0)
    loss_fn = rlstab.load("target_po").compile()
    stats = loss_fn.gather([rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, response_mask=mask,
                                              advantages=rewards, group_ids=group_ids)])
    other = rlstab.TokenBatch(logprobs=logprobs[:4], old_logprobs=old[:4], response_mask=mask[:4],
                              advantages=torch.zeros(4), group_ids=torch.full((4,), 99))
    with pytest.raises(rlstab.BatchError, match=r"target_po: group_ids \[99\]"):
        loss_fn(other, step=stats)
