"""DAPO dynamic sampling: the trainer-side filter and its exact in-loss equivalent."""

import pytest
import torch

import rlstab
from rlstab.step import filter_groups, uniform_groups

from batches import random_batch

REWARDS = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 1, 1, 2, 2, 3])


def test_filter_drops_groups_whose_rewards_are_all_equal():
    # group 0: 1, 1 (drop); group 1: 0, 1 (keep); group 2: 0, 0 (drop); group 3: a single response (kept, as veRL)
    assert uniform_groups(REWARDS, GROUPS).tolist() == [0, 2]
    assert filter_groups(REWARDS, GROUPS).tolist() == [False, False, True, True, False, False, True]


def test_equality_is_exact():
    # 0.1 three times: veRL's float std of [0.1, 0.1, 0.1] is 1.4e-17, not 0; the group is uniform all the same
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1 + 1e-7], dtype=torch.float64)
    assert filter_groups(rewards, torch.tensor([5, 5, 5, 7, 7])).tolist() == [False, False, False, True, True]


def objective(**extra):
    return rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"},
                        "group_filter": {"kind": "dynamic_sampling"}, **extra})


def test_dropped_responses_leave_every_denominator():
    # group 0: rewards 1, 1 (dropped), 3 tokens each; group 1: rewards 1, 0 with 2 and 1 tokens.
    # GRPO on group 1: mean 0.5, std (unbiased) 0.7071: A = +0.7071, -0.7071. l = -A (r = 1).
    # token-mean over the 3 remaining tokens: -(2 * 0.7071 - 0.7071) / 3 = -0.2357 (unfiltered: / 9)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    b = rlstab.TokenBatch(logprobs=torch.zeros(4, 3), response_mask=mask, rewards=torch.tensor([1.0, 1.0, 1.0, 0.0]),
                          group_ids=torch.tensor([0, 0, 1, 1]))
    out = objective().compile()(b)
    assert out.loss.item() == pytest.approx(-(2 ** 0.5 / 2) / 3, rel=1e-5)
    assert (out.metrics["tokens/valid"], out.metrics["step/groups_dropped"]) == (3, 1)
    assert out.metrics["step/groups_dropped_fraction"] == 0.5
    plain = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"}})
    assert plain.compile()(b).loss.item() == pytest.approx(-(2 ** 0.5 / 2) / 9, rel=1e-5)


def rows(batch, idx, leaf=None):
    fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    out = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
    if leaf is not None:
        out["logprobs"] = leaf[idx]
    return rlstab.TokenBatch(**out)


@pytest.mark.parametrize("advantage", [{"kind": "grpo"}, {"kind": "reinforce_pp"}, {"kind": "rloo"}])
def test_in_loss_filter_equals_training_on_the_filtered_batch(advantage):
    """Over two micro-batches, with S2T and a batch-whitened estimator: exactly the loss of the filtered batch."""
    b = random_batch(B=24, T=16, seed=5, groups=8)
    rewards = b.rewards.clone()
    rewards[b.group_ids == 1] = 1.0  # make two groups uniform
    rewards[b.group_ids == 4] = 0.0
    b = rows(b, slice(None))
    b = rlstab.TokenBatch(**{**{f: getattr(b, f) for f in b.__dataclass_fields__}, "rewards": rewards})
    keep = filter_groups(rewards, b.group_ids)
    assert 0 < int(keep.sum()) < 24

    base = {"extends": "stapo", "advantage": advantage}
    filtered = rlstab.load(base).compile()
    ref_leaf = b.logprobs.detach().clone().requires_grad_()
    ref = filtered(rows(b, keep, ref_leaf))
    (ref_grad,) = torch.autograd.grad(ref.loss, ref_leaf)

    loss_fn = rlstab.load({**base, "group_filter": {"kind": "dynamic_sampling"}}).compile()
    leaf = b.logprobs.detach().clone().requires_grad_()
    parts = [rows(b, slice(0, 10), leaf), rows(b, slice(10, 24), leaf)]
    stats = loss_fn.gather(parts)
    total = sum(loss_fn(p, step=stats).loss for p in parts)
    (grad,) = torch.autograd.grad(total, leaf)
    assert total.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-7)
    assert grad[~keep].abs().sum() == 0
    assert stats.counts.tokens_valid == ref.metrics["step/tokens_valid"]


def test_the_filter_works_with_given_advantages():
    # The trainer's advantages are used as they are, but responses of uniform groups still leave the batch.
    mask = torch.ones(4, 2, dtype=torch.bool)
    b = rlstab.TokenBatch(logprobs=torch.zeros(4, 2), response_mask=mask, advantages=torch.tensor([1.0, 1.0, 1.0, -1.0]),
                          rewards=torch.tensor([1.0, 1.0, 1.0, 0.0]), group_ids=torch.tensor([0, 0, 1, 1]))
    # rows 2, 3 remain: -(1 * 2 - 1 * 2) / 4 = 0 ; rows 0, 1 (advantage 1) would have pulled it to -4 / 8
    assert objective().compile()(b).loss.item() == pytest.approx(0.0)


def test_the_filter_needs_rewards_and_group_ids():
    b = rlstab.TokenBatch(logprobs=torch.zeros(1, 2), response_mask=torch.ones(1, 2, dtype=torch.bool),
                          advantages=torch.ones(1))
    with pytest.raises(rlstab.BatchError, match=r"group_filter \(dynamic_sampling\) reads TokenBatch\.group_ids"):
        objective().compile()(b)


def test_filter_on_shaped_rewards():
    # Both responses are correct (reward 1) but 2 and 8 tokens long; overlong shaping (L_max 8, buffer 4):
    # penalties 0 and -1: shaped rewards 1 and 0 differ, so the group trains when filtering on shaped rewards.
    mask = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0], [1] * 8], dtype=torch.bool)
    b = rlstab.TokenBatch(logprobs=torch.zeros(2, 8), response_mask=mask, rewards=torch.ones(2),
                          group_ids=torch.zeros(2, dtype=torch.long))
    shaping = {"reward_shaping": [{"kind": "overlong", "max_length": 8, "buffer": 4}]}
    raw = objective(**shaping).compile()(b)
    assert raw.metrics["tokens/valid"] == 0 and raw.loss.item() == 0.0
    shaped = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"},
                          "group_filter": {"kind": "dynamic_sampling", "on": "shaped_rewards"}, **shaping})
    assert shaped.compile()(b).metrics["tokens/valid"] == 10
