"""Rewards finite in float32 but whose squares are not (about 1.9e19 and more) still give their group
its advantages: the group statistics are summed in float64. A spread past float32 itself is refused."""

from __future__ import annotations

import math

import pytest
import torch

from rlstab.advantages import GDPO, GRPO, RLOO, GroupTable, ReinforcePP
from rlstab.batch import BatchError

HALF = 1 / math.sqrt(2)


def advantages(estimator, rewards, group_ids):
    rewards, group_ids = torch.tensor(rewards), torch.tensor(group_ids)
    lengths = torch.ones(len(rewards))
    return estimator.apply(estimator.fit(rewards, group_ids, lengths), rewards, group_ids)


def test_the_table_of_a_group_of_1e20_and_0():
    # mean 5e19; unbiased variance (5e19^2 + 5e19^2) / 1 = 5e39 (past float32's 3.4e38), std sqrt(5e39) = 7.0711e19.
    table = GroupTable.fit(torch.tensor([1e20, 0.0]), torch.tensor([0, 0]))
    assert table.mean.dtype == table.std.dtype == torch.float32
    assert table.mean.item() == pytest.approx(5e19, rel=1e-6)
    assert table.std.item() == pytest.approx(math.sqrt(5e39), rel=1e-6)


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        (GRPO(), [HALF, -HALF]),  # (1e20 - 5e19) / 7.0711e19; the eps 1e-6 is nothing beside it
        (ReinforcePP(), [HALF, -HALF]),  # whitened over 2 tokens: (x - 5e19) / sqrt(5e39)
        (ReinforcePP(subtract_group_mean=True), [HALF, -HALF]),  # x = +-5e19, mean 0, var 5e39
        (RLOO(), [1e20, -1e20]),  # 2/1 * (R - 5e19)
        (GDPO(source="rewards"), [HALF, -HALF]),  # +-0.7071 per group, whitened: mean 0, var 1 -> +-0.7071
    ],
)
def test_a_group_of_1e20_and_0_gets_its_advantages(estimator, expected):
    got = advantages(estimator, [1e20, 0.0], [0, 0])
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(expected, rel=1e-5)


def test_a_huge_group_leaves_the_others_as_they_were():
    # group 1: [1, 0, 1, 1]: mean 0.75, unbiased std sqrt(0.25) = 0.5 -> 0.5, -1.5, 0.5, 0.5.
    got = advantages(GRPO(), [1e20, 0.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1, 1, 1])
    assert got.tolist() == pytest.approx([HALF, -HALF, 0.5, -1.5, 0.5, 0.5], rel=1e-5)


@pytest.mark.parametrize("estimator", [GRPO(), RLOO(), ReinforcePP(), ReinforcePP(subtract_group_mean=True)])
def test_a_spread_past_float32_is_refused_not_zeroed(estimator):
    # [3e38, -3e38]: std sqrt(2 * 9e76) = 4.24e38, past float32's 3.4e38.
    with pytest.raises(BatchError, match=r"^rewards: the .* spread too far for float32 \(std 4\.24e\+38.*scale the rewards down"):
        advantages(estimator, [3e38, -3e38], [0, 0])
