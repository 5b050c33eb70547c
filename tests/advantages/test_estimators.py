"""Advantage estimators on hand-computed rewards."""

import math

import pytest
import torch

import rlstab
from rlstab.advantages import GRPO, RLOO, ReinforcePP

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 3.0])
GROUPS = torch.tensor([7, 7, 9, 9, 4])
LENGTHS = torch.tensor([3.0, 1.0, 2.0, 2.0, 1.0])


def estimate(estimator, rewards=REWARDS, groups=GROUPS, lengths=LENGTHS):
    return estimator.apply(estimator.fit(rewards, groups, lengths), rewards, groups)


def test_grpo():
    # group 7: mean 0.5, unbiased std sqrt(2 * 0.25 / 1) = 0.70711 -> +-0.70711
    # group 9: all equal -> 0 / (0 + 1e-6) = 0; group 4 has one response: mean 0, std 1 -> A = R = 3
    a = estimate(GRPO())
    s = math.sqrt(0.5)
    assert torch.allclose(a, torch.tensor([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0, 3.0]))


def test_dr_grpo_drops_the_std():
    assert torch.allclose(estimate(GRPO(normalize_std=False)), torch.tensor([0.5, -0.5, 0.0, 0.0, 3.0]))


def test_rloo():
    # n = 2: 2 / 1 * (R - mean) = +-1; a group of one keeps A = R
    assert torch.allclose(estimate(RLOO()), torch.tensor([1.0, -1.0, 0.0, 0.0, 3.0]))


def test_reinforce_pp_whitens_over_tokens():
    rewards, groups, lengths = torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([3.0, 1.0])
    # token-weighted mean (3 * 1 + 1 * 0) / 4 = 0.75; unbiased var (3 * 0.25^2 + 1 * 0.75^2) / 3 = 0.25
    a = estimate(ReinforcePP(), rewards, groups, lengths)
    assert torch.allclose(a, torch.tensor([0.25 / 0.5, -0.75 / 0.5]), atol=1e-6)


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    rewards, groups, lengths = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), torch.ones(4)
    # x = (0.5, -0.5, 0, 0): mean 0, unbiased var 0.5 / 3
    a = estimate(ReinforcePP(subtract_group_mean=True), rewards, groups, lengths)
    assert torch.allclose(a, torch.tensor([0.5, -0.5, 0.0, 0.0]) / math.sqrt(0.5 / 3), atol=1e-5)


def test_loss_estimates_advantages_from_rewards_when_absent(make_batch):
    batch = make_batch(seed=3)
    out = rlstab.load("grpo").compile()(batch)
    fields = {f: getattr(batch, f) for f in ("logprobs", "old_logprobs", "response_mask")}
    given = rlstab.TokenBatch(**fields, advantages=estimate(GRPO(), batch.rewards, batch.group_ids, None))
    assert out.loss.item() == pytest.approx(rlstab.load("grpo").compile()(given).loss.item(), abs=1e-7)


def test_unknown_group_is_an_error():
    est = GRPO()
    stats = est.fit(REWARDS, GROUPS, LENGTHS)
    with pytest.raises(ValueError, match="not in the step"):
        est.apply(stats, torch.tensor([1.0]), torch.tensor([5]))
