"""The pre-registered dose-trend test: per-seed least-squares slopes on the centred dose ranks, a t-test over seeds."""

import math

import pytest

from rlstab.lab.trend import rank_weights, trend_test


def test_the_weights_are_the_centred_ranks_of_the_doses_whatever_their_spread():
    assert rank_weights([0, 0.002, 0.01, 0.05]) == [-1.5, -0.5, 0.5, 1.5]
    assert rank_weights([0.01, 0, 0.05, 0.002]) == [0.5, -1.5, 1.5, -0.5]  # given in any order
    assert rank_weights([1, 2, 100]) == [-1.0, 0.0, 1.0]


def test_a_trend_by_hand():
    # Doses given out of order: 0.01, 0, 0.05, 0.002 -> weights 0.5, -1.5, 1.5, -0.5; sum of squares 5.
    doses = [0.01, 0, 0.05, 0.002]
    # seed 0: the metric is 0.1 x rank (0.3, 0.1, 0.4, 0.2): sum w x = 0.15 - 0.15 + 0.6 - 0.1 = 0.5, slope 0.1
    # seed 1: flat: slope 0
    # seed 2: 0.3, -0.1, 0.5, 0.1: 0.15 + 0.15 + 0.75 - 0.05 = 1.0, slope 0.2
    # seed 3: one arm missing: left out
    values = {0: [0.3, 0.1, 0.4, 0.2], 1: [0.2, 0.2, 0.2, 0.2], 2: [0.3, -0.1, 0.5, 0.1], 3: [0.1, None, 0.1, 0.1]}
    per_arm = [{seed: v[i] for seed, v in values.items()} for i in range(4)]
    t = trend_test(per_arm, doses)
    assert t["weights"] == [0.5, -1.5, 1.5, -0.5] and t["seeds"] == [0, 1, 2]
    assert t["slopes"] == pytest.approx([0.1, 0.0, 0.2])
    # slopes 0.1, 0, 0.2: mean 0.1, sd 0.1, n 3; interval 0.1 +- 4.3027 x 0.1 / sqrt(3) = 0.1 +- 0.248417
    assert (t["n"], t["wins"], t["ties"], t["losses"]) == (3, 2, 1, 0)
    assert t["mean"] == pytest.approx(0.1) and t["sd"] == pytest.approx(0.1)
    assert t["low"] == pytest.approx(0.1 - 0.248417, abs=1e-6) and t["high"] == pytest.approx(0.1 + 0.248417, abs=1e-6)
    # t = 0.1 / (0.1 / sqrt 3) = sqrt 3, df 2: two-sided p = 1 - t / sqrt(2 + t^2) = 1 - sqrt(3/5) = 0.225403
    assert t["p"] == pytest.approx(1 - math.sqrt(3 / 5), abs=1e-9) and t["p_holm"] == t["p"]
    assert t["distinguishable"] is False
    # MDE at df 2, where the t-test's power has a closed form (tests/lab/test_power.py): 80% power at
    # lambda^2 = 2 / (0.05 x 1.95) x ln(0.95 / 0.2) = 20.51282 x 1.558145 = 31.96194, d = sqrt(31.96194 / 3) = 3.26404,
    # so 0.326404 (the normal approximation, (4.30265 + 1.06066) x 0.1 / sqrt(3), said 0.30966)
    assert t["mde"] == pytest.approx(0.326404, abs=1e-6)
    assert t["n_effective"] == 3 and t["sd_effective"] == t["sd"]


def test_a_seeds_own_level_cancels():
    # the weights sum to 0: adding a constant to every arm of a seed leaves its slope as it was
    arms = [{0: 0.1, 1: 0.5}, {0: 0.2, 1: 0.7}, {0: 0.4, 1: 0.6}]
    shifted = [{s: v + (10.0 if s == 1 else 0.0) for s, v in arm.items()} for arm in arms]
    assert trend_test(shifted, [0, 1, 2])["slopes"] == pytest.approx(trend_test(arms, [0, 1, 2])["slopes"])


def test_arms_and_doses_must_match():
    with pytest.raises(ValueError, match="one dose per arm"):
        trend_test([{0: 1.0}, {0: 2.0}], [0, 1, 2])
