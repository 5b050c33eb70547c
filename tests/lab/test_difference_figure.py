"""The paired-difference figure's numbers: per seed, objective minus baseline at the steps both report."""

import pytest

from rlstab.lab.difference_figure import paired_curve, write_differences


def test_paired_curve_by_hand():
    mine = {0: [{"step": 0, "accuracy": 0.5}, {"step": 5, "accuracy": 0.7}],
            1: [{"step": 0, "accuracy": 0.4}, {"step": 5, "accuracy": 0.4}, {"step": 6, "accuracy": 0.9}]}
    base = {0: [{"step": 0, "accuracy": 0.5}, {"step": 5, "accuracy": 0.5}],
            1: [{"step": 0, "accuracy": 0.3}, {"step": 5, "accuracy": 0.2}, {"step": 6, "accuracy": None}]}
    c = paired_curve(mine, base, "accuracy")
    assert c["steps"] == [0, 5]  # step 6: the baseline has no accuracy there
    # step 0: differences 0.0 and 0.1, mean 0.05; sd 0.070711, se 0.05, half width 12.7062 x 0.05 = 0.63531
    assert c["mean"][0] == pytest.approx(0.05)
    assert c["low"][0] == pytest.approx(0.05 - 0.63531, abs=1e-5) and c["high"][0] == pytest.approx(0.05 + 0.63531, abs=1e-5)
    # step 5: 0.2 and 0.2: mean 0.2, no spread
    assert c["mean"][1] == pytest.approx(0.2) and c["low"][1] == pytest.approx(0.2)
    assert c["per_seed"][0] == [(0, 0.0), (5, pytest.approx(0.2))]


def test_no_pair_no_figure(tmp_path):
    data = {"settings": {"baseline": "grpo", "objectives": {"grpo": {}}, "pairs": {}, "regimes": {"r": {}}, "seeds": [0]},
            "runs": []}
    assert write_differences(tmp_path, data, tmp_path / "d.png") is None
    assert not (tmp_path / "d.png").exists()
