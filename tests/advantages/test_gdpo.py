"""GDPO by hand: per-dimension group normalisation, weights, the step's whitening; TokenBatch.reward_components."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import rlstab
from rlstab import TokenBatch
from rlstab.advantages import GDPO, GRPO
from rlstab.batch import BatchError

NAN = float("nan")
# The paper's collapse example: group 0 rewards (0, 0), (1, 0); group 1 (0, 0), (1, 1).
COMPONENTS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
GROUPS = torch.tensor([0, 0, 1, 1])
ONES = torch.ones(4, dtype=torch.bool)


def estimate(est, components, groups, lengths, real):
    columns = {f"reward_{k}": components[:, k] for k in range(components.shape[1])}
    state = est.fit(components.sum(-1), groups, lengths, real, **columns)
    t = SimpleNamespace(batch=SimpleNamespace(reward_components=components))
    return est.micro_batch_advantages(state, t, components.sum(-1), groups, real)


def test_dimensions_are_normalised_apart():
    # dimension 1: both groups (0, 1): +-0.5 / sqrt(1/2) = +-0.70711 each
    # dimension 2: group 0 (0, 0): std 0, centred 0 -> 0; group 1 (0, 1): +-0.70711
    # sums: group 0 -0.70711, 0.70711; group 1 -1.41421, 1.41421
    # whitening, lengths 1: mean 0, var (0.5 + 0.5 + 2 + 2) / 3 = 5/3 -> x 1/sqrt(5/3) = 0.774597
    a = estimate(GDPO(), COMPONENTS, GROUPS, torch.ones(4), ONES)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)  # one dimension's +-advantage in a group (0, 1)
    scale = 1 / math.sqrt((2 * s**2 + 2 * (2 * s) ** 2) / 3 + 1e-8)
    expected = torch.tensor([-s, s, -2 * s, 2 * s]) * scale
    torch.testing.assert_close(a, expected)
    torch.testing.assert_close(a, torch.tensor([-0.547723, 0.547723, -1.095445, 1.095445]), rtol=0, atol=1e-5)


def test_grpo_on_the_summed_reward_collapses_the_two_groups():
    # sums: group 0 (0, 1), group 1 (0, 2): GRPO gives both -0.70711, 0.70711; GDPO tells them apart (above)
    grpo = GRPO()
    rewards = COMPONENTS.sum(-1)
    a = grpo.apply(grpo.fit(rewards, GROUPS, torch.ones(4), ONES), rewards, GROUPS, ONES)
    torch.testing.assert_close(a[:2], a[2:])


def test_weights_and_lengths():
    # weights (2, 1): sums group 0 -1.41421, 1.41421 (2 x 0.70711); group 1 -2.12132, 2.12132
    # lengths 1, 3, 2, 2 (N = 8): mean (-1.41421 + 3 * 1.41421 - 2 * 2.12132 + 2 * 2.12132) / 8 = 0.353553
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    x = torch.tensor([-2 * s, 2 * s, -3 * s, 3 * s])
    lengths = torch.tensor([1.0, 3.0, 2.0, 2.0])
    mean = (lengths * x).sum() / 8
    var = (lengths * (x - mean) ** 2).sum() / 7
    a = estimate(GDPO(weights=[2.0, 1.0]), COMPONENTS, GROUPS, lengths, ONES)
    torch.testing.assert_close(a, (x - mean) / torch.sqrt(var + 1e-8))
    assert abs(float(mean) - 0.353553) < 1e-5


def test_padding_rows_hold_anything():
    components = torch.cat([COMPONENTS, torch.tensor([[NAN, 5.0]])])
    groups = torch.cat([GROUPS, torch.tensor([1])])
    real = torch.cat([ONES, torch.tensor([False])])
    a = estimate(GDPO(), components, groups, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0]), real)
    torch.testing.assert_close(a[:4], estimate(GDPO(), COMPONENTS, GROUPS, torch.ones(4), ONES))
    assert a[4] == 0


def test_through_the_compiled_loss_in_two_micro_batches():
    """TokenBatch.reward_components reaches GDPO through gather; a group split across micro-batches is exact."""
    objective = rlstab.load({"advantage": {"kind": "gdpo"}, "surrogate": {"kind": "none"},
                             "aggregation": {"kind": "token-sum", "count": "valid"}})
    loss_fn = objective.compile()
    logprobs = torch.full((4, 2), -1.0, requires_grad=True)
    mask = torch.tensor([[True, False]] * 4)
    order = torch.tensor([0, 2, 1, 3])  # each micro-batch holds half of each group
    batches = [
        TokenBatch(logprobs=logprobs[i:i + 2], response_mask=mask[i:i + 2], rewards=torch.zeros(2),
                   group_ids=GROUPS[order][i:i + 2], reward_components=COMPONENTS[order][i:i + 2])
        for i in (0, 2)
    ]
    stats = loss_fn.gather(batches)
    for b in batches:
        loss_fn(b, step=stats).loss.backward()
    expected = estimate(GDPO(), COMPONENTS, GROUPS, torch.ones(4), ONES)[order]
    torch.testing.assert_close(-logprobs.grad[:, 0], expected)


def test_a_batch_without_reward_components_is_refused():
    loss_fn = rlstab.load({"advantage": {"kind": "gdpo"}, "surrogate": {"kind": "none"},
                           "aggregation": {"kind": "token-mean", "count": "valid"}}).compile()
    batch = TokenBatch(logprobs=torch.zeros(2, 2), response_mask=torch.ones(2, 2), rewards=torch.zeros(2),
                       group_ids=torch.tensor([0, 0]))
    with pytest.raises(BatchError, match="reward_components"):
        loss_fn(batch)


def test_weights_must_match_the_dimensions():
    t = SimpleNamespace(batch=SimpleNamespace(reward_components=COMPONENTS))
    with pytest.raises(BatchError, match="2 columns, but 3 weights"):
        GDPO(weights=[1.0, 1.0, 1.0]).sequence_inputs(t)


def test_source_rewards_is_grpo_whitened():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    est = GDPO(source="rewards")
    a = est.apply(est.fit(rewards, GROUPS, torch.ones(4), ONES), rewards, GROUPS, ONES)
    # GRPO: group 0 +-0.70711, group 1 (0, 0): 0; whitening: mean 0, var (0.5 + 0.5) / 3 = 1/3
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(a, torch.tensor([s, -s, 0.0, 0.0]) / math.sqrt(2 * s**2 / 3 + 1e-8))


def test_reward_components_must_be_b_by_k_floats():
    with pytest.raises(BatchError, match=r"must be \[B, K\]"):
        TokenBatch(logprobs=torch.zeros(2, 2), response_mask=torch.ones(2, 2), reward_components=torch.zeros(3, 2))
    with pytest.raises(BatchError, match="floating point"):
        TokenBatch(logprobs=torch.zeros(2, 2), response_mask=torch.ones(2, 2),
                   reward_components=torch.zeros(2, 2, dtype=torch.long))


def test_a_group_of_one_keeps_its_rewards():
    # group 5 holds one response: each dimension's mean 0 and std 1 (veRL's GRPO convention), so S = sum_k r_k / (1 + 1e-6)
    components = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 3.0]])
    groups = torch.tensor([0, 0, 5])
    a = estimate(GDPO(), components, groups, torch.ones(3), torch.ones(3, dtype=torch.bool))
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    x = torch.tensor([-s, s, 5.0 / (1 + 1e-6)])
    mean = x.mean()  # lengths 1: every response weighs 1
    var = ((x - mean) ** 2).sum() / 2
    torch.testing.assert_close(a, (x - mean) / torch.sqrt(var + 1e-8))
