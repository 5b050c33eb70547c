import math

import pytest

from rlstab.lab.statistics import mean_interval, paired_difference, t975


def test_t_quantiles_match_the_table_and_the_expansion():
    assert t975(1) == 12.7062
    assert t975(4) == 2.7764  # 5 seeds
    # Beyond the table, the expansion: published values 2.0211 (40), 2.0003 (60), 1.9799 (120).
    assert t975(40) == pytest.approx(2.0211, abs=2e-4)
    assert t975(60) == pytest.approx(2.0003, abs=1e-4)
    assert t975(120) == pytest.approx(1.9799, abs=1e-4)
    # It joins the table smoothly: at 31, between 30's 2.0423 and 40's 2.0211 (published 2.0395).
    assert t975(31) == pytest.approx(2.0395, abs=2e-4)
    with pytest.raises(ValueError):
        t975(0)


def test_mean_interval_by_hand():
    # values 1, 2, 3, 4, 5: mean 3, sample sd sqrt(10/4) = 1.5811, se = 1.5811 / sqrt(5) = 0.70711,
    # half width 2.7764 * 0.707107 = 1.963211
    stat = mean_interval([1, 2, 3, 4, 5])
    assert stat["mean"] == 3.0 and stat["n"] == 5
    assert stat["low"] == pytest.approx(3 - 1.963211, abs=1e-6)
    assert stat["high"] == pytest.approx(3 + 1.963211, abs=1e-6)


def test_mean_interval_edges():
    assert mean_interval([]) == {"mean": None, "low": None, "high": None, "n": 0}
    assert mean_interval([None, 0.5]) == {"mean": 0.5, "low": None, "high": None, "n": 1}
    same = mean_interval([0.25, 0.25, 0.25])
    assert same["low"] == same["high"] == 0.25
    assert math.isnan(mean_interval([1.0, float("nan")])["mean"])  # NaN is kept, never hidden


def test_paired_difference_by_hand():
    # diffs by seed: 0.1, 0.2, 0.0, 0.1 -> mean 0.1, sd sqrt((0 + .01 + .01 + 0) / 3) = 0.08165,
    # se 0.040825, half width 3.1824 * 0.040825 = 0.12992: interval [-0.0299, 0.2299] contains 0
    values = {0: 0.6, 1: 0.7, 2: 0.5, 3: 0.6, 9: 0.9}
    base = {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}  # seed 9 has no baseline run: left out
    d = paired_difference(values, base)
    assert d["n"] == 4 and d["mean"] == pytest.approx(0.1)
    assert d["low"] == pytest.approx(0.1 - 0.12992, abs=1e-5)
    assert (d["wins"], d["ties"], d["losses"]) == (3, 1, 0)
    assert d["distinguishable"] is False


def test_paired_difference_distinguishable_and_undecided():
    d = paired_difference({0: 0.6, 1: 0.61, 2: 0.62}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert d["distinguishable"] is True and d["low"] > 0
    assert paired_difference({0: 0.6}, {0: 0.5})["distinguishable"] is None
    assert paired_difference({0: 0.4, 1: 0.3}, {0: 0.5, 1: 0.5})["losses"] == 2
