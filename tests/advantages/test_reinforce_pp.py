"""rlstab.advantages.reinforce_pp: returns whitened over the step's valid tokens (veRL's masked_whiten)."""

import math

import pytest
import torch

from rlstab.advantages.reinforce_pp import ReinforcePP, whitening_stats
from rlstab.batch import BatchError


def test_whitening_stats_weigh_each_response_by_its_length():
    # x = (2, -1), L = (1, 2): N = 3, mean = (2 - 2) / 3 = 0; var = (1 * 4 + 2 * 1) / (3 - 1) = 3
    mean, var = whitening_stats(torch.tensor([2.0, -1.0]), torch.tensor([1, 2]))
    assert mean.dtype == torch.float32 and var.dtype == torch.float64
    assert mean.item() == 0.0 and var.item() == 3.0


def test_padding_rows_are_left_out_whatever_they_hold():
    responses = torch.tensor([True, True, False])
    mean, var = whitening_stats(torch.tensor([2.0, -1.0, float("nan")]), torch.tensor([1, 2, 0]), responses)
    assert (mean.item(), var.item()) == (0.0, 3.0)


def test_large_values_keep_a_finite_variance():
    # x = (+-1e20), L = (1, 1): var = 2e40 / 1, past float32 (3.4e38) but finite in float64
    _, var = whitening_stats(torch.tensor([1e20, -1e20]), torch.tensor([1, 1]))
    assert var.item() == pytest.approx(2e40)


def test_a_spread_past_float32_is_refused():
    # x = (+-3e38): std = sqrt(2) * 3e38 = 4.2e38 > 3.4e38
    with pytest.raises(BatchError, match="rewards: the step's values spread too far for float32"):
        whitening_stats(torch.tensor([3e38, -3e38]), torch.tensor([1, 1]))


def test_advantages_with_the_group_mean_subtracted_first():
    rewards, groups, lengths = torch.tensor([3.0, 1.0, 5.0]), torch.tensor([0, 0, 1]), torch.tensor([1, 1, 2])
    est = ReinforcePP(subtract_group_mean=True, eps=0.0)
    a = est.apply(est.fit(rewards, groups, lengths), rewards, groups)
    # group 0's mean 2; group 1 has one response, which subtracts 0 (veRL): x = (1, -1, 5)
    # mean (1 - 1 + 2 * 5) / 4 = 2.5; var (1 * 1.5^2 + 1 * 3.5^2 + 2 * 2.5^2) / 3 = 27 / 3 = 9 -> std 3
    assert torch.allclose(a, torch.tensor([-1.5, -3.5, 2.5]) / 3.0)


def test_padding_rows_get_zero():
    rewards, groups, lengths = torch.tensor([1.0, 0.0, 7.0]), torch.tensor([0, 1, 2]), torch.tensor([1, 1, 0])
    responses = torch.tensor([True, True, False])
    est = ReinforcePP(eps=0.0)
    a = est.apply(est.fit(rewards, groups, lengths, responses), rewards, groups, responses)
    # x = (1, 0): mean 0.5, var (0.25 + 0.25) / 1 = 0.5 -> A = +-0.5 / 0.70711; the padding row 0
    assert torch.allclose(a, torch.tensor([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0]))


def test_describe():
    assert ReinforcePP().describe() == (
        "reinforce_pp: A_i = (x_i - mu) / sqrt(var + 1e-08), x_i = R_i, mu and var over the step's valid tokens"
    )
    assert "x_i = R_i - mean_g R" in ReinforcePP(subtract_group_mean=True).describe()
