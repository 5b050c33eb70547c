"""The pass@k (leave-one-out max) advantage by hand: unique best, ties, std, groups of one, padding rows."""

from __future__ import annotations

import math

import pytest
import torch

from rlstab.advantages import GRPOPassK

NAN = float("nan")


def estimate(est, rewards, groups, real=None):
    real = torch.ones(len(rewards), dtype=torch.bool) if real is None else real
    return est.apply(est.fit(rewards, groups, torch.ones(len(rewards)), real), rewards, groups, real)


def test_only_the_unique_best_gets_its_margin():
    rewards = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 0.0, 0.0, 0.0, NAN])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 0])
    real = torch.tensor([True] * 8 + [False])  # the padding row, in group 0, holds NaN
    # group 0: best 0.9 (unique), runner-up 0.5 -> 0.4 on it, 0 elsewhere; group 1: tie at the top -> all 0;
    # group 2: all equal -> 0
    a = estimate(GRPOPassK(normalize_std=False), rewards, groups, real)
    torch.testing.assert_close(a, torch.tensor([0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]))


def test_std_normalisation():
    rewards, groups = torch.tensor([0.2, 0.9, 0.5]), torch.tensor([0, 0, 0])
    # mean 8/15; deviations -1/3, 11/30, -1/30; unbiased var (1/9 + 121/900 + 1/900) / 2 = 0.12333...
    std = math.sqrt((1 / 9 + 121 / 900 + 1 / 900) / 2)
    a = estimate(GRPOPassK(), rewards, groups)
    torch.testing.assert_close(a, torch.tensor([0.0, 0.4 / (std + 1e-6), 0.0]))


def test_binary_rewards_one_right_answer():
    # [1, 0, 0, 0]: margin 1, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5 -> A = 1 / 0.500001
    a = estimate(GRPOPassK(), torch.tensor([0.0, 1.0, 0.0, 0.0]), torch.tensor([7, 7, 7, 7]))
    torch.testing.assert_close(a, torch.tensor([0.0, 1 / (0.5 + 1e-6), 0.0, 0.0]))


@pytest.mark.parametrize("with_padding", [False, True])
def test_a_group_of_one_is_an_error(with_padding):
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, NAN]), torch.tensor([0, 0, 3, 3])
    real = torch.tensor([True, True, True, not with_padding])
    if not with_padding:  # group 3 holds two responses: fine
        estimate(GRPOPassK(), rewards.nan_to_num(), groups, real)
        return
    # group 3 holds one response and a padding row: one response, refused as veRL refuses it
    with pytest.raises(ValueError, match=r"groups \[3\] hold one response"):
        estimate(GRPOPassK(), rewards, groups, real)


# ----------------------------------------------------------------------------- Pass@k Training's closed form (k)


def closed_form(n: int, c: int, k: int, eps: float = 1e-6) -> tuple[float, float]:
    """Chen et al. (arXiv 2508.10751) eqs. 14-15, with math.comb (0 for a negative top, as scipy's comb)."""
    comb = lambda a, b: math.comb(a, b) if a >= 0 else 0  # noqa: E731
    mean = 1 - comb(n - c, k) / comb(n, k)
    sigma = math.sqrt(mean * (1 - mean))
    return (1 - mean) / (sigma + eps), (1 - mean - comb(n - c - 1, k - 1) / comb(n - 1, k - 1)) / (sigma + eps)


def test_closed_form_by_hand():
    # n = 4, c = 1, k = 2: mean pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5, sigma = 0.5
    # right: (1 - 0.5) / 0.500001; wrong: (1 - 0.5 - C(2,1)/C(3,1)) / 0.500001 = (0.5 - 2/3) / 0.500001
    rewards, groups = torch.tensor([0.0, 1.0, 0.0, 0.0, NAN]), torch.tensor([0, 0, 0, 0, 0])
    real = torch.tensor([True, True, True, True, False])
    a = estimate(GRPOPassK(k=2), rewards, groups, real)
    s = 0.5 + 1e-6
    torch.testing.assert_close(a, torch.tensor([(0.5 - 2 / 3) / s, 0.5 / s, (0.5 - 2 / 3) / s, (0.5 - 2 / 3) / s, 0.0]))
    # without the division: the numerators
    a = estimate(GRPOPassK(k=2, normalize_std=False), rewards, groups, real)
    torch.testing.assert_close(a, torch.tensor([0.5 - 2 / 3, 0.5, 0.5 - 2 / 3, 0.5 - 2 / 3, 0.0]))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_closed_form_matches_the_formula_on_every_group_composition(k):
    n = 8
    rewards = torch.cat([torch.tensor([1.0] * c + [0.0] * (n - c)) for c in range(n + 1)])
    groups = torch.arange(n + 1).repeat_interleave(n)
    a = estimate(GRPOPassK(k=k), rewards, groups)
    for c in range(n + 1):
        right, wrong = closed_form(n, c, k)
        expected = torch.tensor([right] * c + [wrong] * (n - c), dtype=torch.float32)
        torch.testing.assert_close(a[c * n:(c + 1) * n], expected, rtol=1e-5, atol=1e-5)
    # saturated groups (all right, or too few wrong for a k-subset without a right one) and all-wrong groups get 0
    torch.testing.assert_close(a[:n], torch.zeros(n))  # c = 0
    torch.testing.assert_close(a[-n:], torch.zeros(n))  # c = n


def test_closed_form_refuses_non_binary_rewards_and_small_groups():
    with pytest.raises(ValueError, match=r"rewards of 0 or 1, got \[0.5\]"):
        estimate(GRPOPassK(k=2), torch.tensor([0.5, 1.0, 0.0]), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match=r"groups \[1\] hold fewer than k = 3"):
        estimate(GRPOPassK(k=3), torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1, 1]))
