"""OPO's length-weighted baseline by hand: groups of one, all-empty groups, padding rows."""

from __future__ import annotations

import torch

from rlstab.advantages import OPO

NAN = float("nan")


def estimate(rewards, groups, lengths, real):
    est = OPO()
    return est.apply(est.fit(rewards, groups, lengths, real), rewards, groups, real)


def test_length_weighted_baseline():
    rewards = torch.tensor([1.0, 0.0, 1.0, 2.0, NAN])
    groups = torch.tensor([0, 0, 0, 1, 0])  # the padding row shares group 0's id: it must not count
    lengths = torch.tensor([1.0, 4.0, 3.0, 5.0, 0.0])
    real = torch.tensor([True, True, True, True, False])
    # group 0: b = (1*1 + 4*0 + 3*1) / (1 + 4 + 3) = 0.5 (the plain mean would be 2/3): A = 0.5, -0.5, 0.5
    # group 1 alone: b = 0 (veRL), A = 2
    torch.testing.assert_close(estimate(rewards, groups, lengths, real), torch.tensor([0.5, -0.5, 0.5, 2.0, 0.0]))


def test_equal_lengths_give_the_group_mean():
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([3, 3, 3, 3])
    a = estimate(rewards, groups, torch.full((4,), 7.0), torch.ones(4, dtype=torch.bool))
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_a_group_whose_tokens_were_all_rejected_uses_the_plain_mean():
    rewards, groups = torch.tensor([1.0, 3.0]), torch.tensor([0, 0])
    # both responses have tokens (not padding) but none is trained: sum L = 0, baseline = mean 2
    a = estimate(rewards, groups, torch.zeros(2), torch.ones(2, dtype=torch.bool))
    torch.testing.assert_close(a, torch.tensor([-1.0, 1.0]))


def test_a_step_of_padding_rows_only():
    a = estimate(torch.tensor([NAN, NAN]), torch.tensor([4, 5]), torch.zeros(2), torch.zeros(2, dtype=torch.bool))
    torch.testing.assert_close(a, torch.zeros(2))
