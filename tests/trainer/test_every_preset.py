"""Every preset trains: two steps of rlstab's embedded trainer, under stale rollouts (so that ratios,
rollout importance weights and the off-policy components see values away from 1), with finite rows."""

import math

import pytest

import rlstab
from rlstab.lab.regimes import load_regime
from rlstab.loading import load
from rlstab.trainer.run import Run

from quick_regimes import QUICK_LAG


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_the_preset_takes_two_steps(name, cache):
    config = load_regime(QUICK_LAG).train_config(steps=2, seed=0)
    run = Run(load(name), config, "add2", cache_dir=cache)
    run.start()
    rows = [run.step().row for _ in range(2)]
    assert [row["step"] for row in rows] == [1, 2] and run.done
    numbers = {key: value for row in rows for key, value in row.items() if isinstance(value, float)}
    assert not [key for key, value in numbers.items() if not math.isfinite(value)], rows
