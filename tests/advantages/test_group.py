"""rlstab.advantages.group: GRPO (and Dr.GRPO) and RLOO over the responses of each prompt, padding rows left out."""

import math

import pytest
import torch

from rlstab.advantages.group import GRPO, RLOO

REWARDS = torch.tensor([1.0, 0.0, 0.0, 5.0])
GROUPS = torch.tensor([0, 0, 0, 0])
RESPONSES = torch.tensor([True, True, True, False])  # the last row is padding: its reward of 5 must not count


def estimate(estimator, rewards=REWARDS, groups=GROUPS, responses=RESPONSES):
    return estimator.apply(estimator.fit(rewards, groups, None, responses), rewards, groups, responses)


def test_grpo_leaves_padding_rows_out_of_the_group():
    # group of 3: mean 1/3; unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), 0.0])
    assert torch.allclose(estimate(GRPO()), expected, atol=1e-6)


def test_dr_grpo_centres_only():
    assert torch.allclose(estimate(GRPO(normalize_std=False)), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0]))


def test_grpo_eps_is_added_to_the_std():
    # group (1, 0): mean 0.5, unbiased std 0.70711; eps 0.5 -> A = 0.5 / 1.20711 = 0.41421
    a = estimate(GRPO(eps=0.5), torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), None)
    assert torch.allclose(a, torch.tensor([0.5, -0.5]) / (math.sqrt(0.5) + 0.5))


def test_grpo_without_eps_gives_a_group_of_equal_rewards_zero_not_nan():
    # groups (1, 1) and (1, 0): the first has std 0, so 0 / (0 + 0) would be NaN; A = 0 there, as at any eps > 0.
    # The second: mean 0.5, unbiased std sqrt(0.5) -> A = +-0.5 / 0.70711 = +-0.70711
    a = estimate(GRPO(eps=0.0), torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), None)
    assert torch.allclose(a, torch.tensor([0.0, 0.0, 0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)]))


def test_rloo_leaves_padding_rows_out_of_n():
    # n = 3 (not 4): A = 3/2 (R - 1/3) = (1, -0.5, -0.5); the padding row 0
    assert torch.allclose(estimate(RLOO()), torch.tensor([1.0, -0.5, -0.5, 0.0]))


def test_rloo_is_the_leave_one_out_baseline():
    # R = (4, 1, 1): leave-one-out means (1, 2.5, 2.5) -> A = (3, -1.5, -1.5)
    a = estimate(RLOO(), torch.tensor([4.0, 1.0, 1.0]), torch.tensor([2, 2, 2]), None)
    assert torch.allclose(a, torch.tensor([3.0, -1.5, -1.5]))


def test_describe():
    assert GRPO().describe() == "grpo: A_i = (R_i - mean_g R) / (std_g R + 1e-06), std unbiased, g = the prompt's group"
    assert GRPO(normalize_std=False).describe() == "grpo (Dr.GRPO, no std): A_i = R_i - mean_g R, g = the prompt's group"
    assert RLOO().describe() == "rloo: A_i = n/(n-1) (R_i - mean_g R), g = the prompt's group of n"


def test_eps_is_bounded():
    with pytest.raises(ValueError):
        GRPO(eps=-1e-6)


def test_grpo_population_std_and_std_floor_give_target_pos_scores():
    # Target PO's scores (arXiv 2604.06159, appendix A; tpo_skill): population std, undivided where std <= 1e-6.
    # Group 0 (1, 0, 0), padding row left out: mean 1/3, population std sqrt((4/9 + 1/9 + 1/9) / 3) = sqrt(2)/3
    # = 0.471405 -> A = (2/3) / 0.471405 = 1.414214 = sqrt(2), and (-1/3) / 0.471405 = -0.707107 = -1/sqrt(2)
    tpo = GRPO(eps=0.0, std="population", std_floor=1e-6)
    a = estimate(tpo)
    assert torch.allclose(a, torch.tensor([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 0.0]), atol=1e-6)
    # Group (0.5, 0.5 + 1e-7): population std 5e-8 <= 1e-6, so A = R - mean = -+5e-8 (tpo_skill's `centered`),
    # where plain eps = 0 would divide: -+1.
    rewards = torch.tensor([0.5, 0.5 + 1e-7], dtype=torch.float64).to(torch.float32)
    a = estimate(tpo, rewards, torch.tensor([0, 0]), None)
    assert torch.allclose(a, rewards - rewards.mean(), atol=0.0, rtol=0.0)
    assert a.abs().max() < 1e-6
    assert torch.allclose(estimate(GRPO(eps=0.0, std="population"), rewards, torch.tensor([0, 0]), None).abs(),
                          torch.ones(2))


def test_grpo_later_fields_leave_the_fingerprint():
    import rlstab

    before = rlstab.load({"advantage": {"kind": "grpo"}, "aggregation": {"kind": "token-mean", "count": "valid"}})
    assert "std" not in before.advantage.model_dump() and "std_floor" not in before.advantage.model_dump()
    assert "population" in GRPO(std="population").describe() and "unbiased" in GRPO().describe()
