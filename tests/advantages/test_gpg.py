"""GPG's advantage by hand: alpha (B / (B - M), veRL's B / #(R != 0), 1), std option, groups of one, padding rows."""

from __future__ import annotations

import math

import pytest
import torch

from rlstab.advantages import GPG

NAN = float("nan")
# group 0: 1, 0, 1; group 1: 1, 1 (all equal: no gradient); group 2: 0.5 alone; the last row is padding
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.5, NAN])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 2, 9])
REAL = torch.tensor([True] * 6 + [False])
LENGTHS = torch.tensor([3.0, 1.0, 2.0, 2.0, 5.0, 4.0, 0.0])


def estimate(estimator, rewards=REWARDS, groups=GROUPS, real=REAL):
    state = estimator.fit(rewards, groups, LENGTHS[: len(rewards)], real)
    return estimator.apply(state, rewards, groups, real), state


def test_paper_alpha_counts_the_responses_of_all_equal_groups():
    a, state = estimate(GPG())
    # B = 6 real responses, M = 2 (group 1's): alpha = 6 / (6 - 2) = 1.5
    # group 0: mean 2/3, centred 1/3, -2/3, 1/3 -> x 1.5 = 0.5, -1, 0.5; group 1: 0; group 2 alone: mean 0, 0.5 x 1.5
    torch.testing.assert_close(state.alpha, torch.tensor(1.5))
    torch.testing.assert_close(a, torch.tensor([0.5, -1.0, 0.5, 0.0, 0.0, 0.75, 0.0]))


def test_verl_alpha_counts_the_nonzero_rewards():
    a, state = estimate(GPG(alpha="nonzero_rewards"))
    # rewards not 0 among the 6 real: 1, 1, 1, 1, 0.5 -> m = 5, alpha = 6 / 5 = 1.2
    torch.testing.assert_close(state.alpha, torch.tensor(1.2))
    torch.testing.assert_close(a, torch.tensor([0.4, -0.8, 0.4, 0.0, 0.0, 0.6, 0.0]))


def test_no_alpha():
    a, _ = estimate(GPG(alpha="none"))
    torch.testing.assert_close(a, torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0, 0.0, 0.5, 0.0]))


def test_std_normalisation():
    a, _ = estimate(GPG(normalize_std=True))
    # group 0's unbiased std: sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3); group 2 alone: std 1
    s = math.sqrt(1 / 3) + 1e-4
    expected = torch.tensor([1.5 * (1 / 3) / s, 1.5 * (-2 / 3) / s, 1.5 * (1 / 3) / s, 0.0, 0.0, 0.75 / (1 + 1e-4), 0.0])
    torch.testing.assert_close(a, expected)


def test_alpha_floor_when_no_group_has_signal():
    rewards, groups = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])
    real = torch.ones(4, dtype=torch.bool)
    a, state = estimate(GPG(), rewards, groups, real)
    # M = B: (B - M) / B = 0, floored at 0.05 -> alpha 20; every advantage is 0 anyway
    torch.testing.assert_close(state.alpha, torch.tensor(20.0))
    torch.testing.assert_close(a, torch.zeros(4))


def test_verl_alpha_without_any_nonzero_reward_is_b():
    rewards, groups = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0, 0, 1])
    a, state = estimate(GPG(alpha="nonzero_rewards"), rewards, groups, torch.ones(3, dtype=torch.bool))
    torch.testing.assert_close(state.alpha, torch.tensor(3.0))  # B / max(0, 1)
    torch.testing.assert_close(a, torch.zeros(3))


@pytest.mark.parametrize("alpha", ["signal_groups", "nonzero_rewards", "none"])
def test_padding_rows_change_nothing(alpha):
    full, _ = estimate(GPG(alpha=alpha))
    a, _ = estimate(GPG(alpha=alpha), REWARDS[:6], GROUPS[:6], REAL[:6])
    torch.testing.assert_close(full[:6], a)
    assert full[6] == 0


def test_describe_names_alpha():
    assert "B / (B - M)" in GPG().describe()
    assert "veRL" in GPG(alpha="nonzero_rewards").describe()
