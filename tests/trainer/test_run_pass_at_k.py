"""``Run`` with held-out pass@k (``pass_k > 0``): the rows gain ``pass_at_k`` and nothing else changes."""

import pytest

from rlstab.lab.regimes import load_regime
from rlstab.loading import load
from rlstab.trainer.config import TrainConfig
from rlstab.trainer.run import Run

from quick_regimes import QUICK

PERM3 = {**QUICK, "name": "quick-perm3", "task": "perm3", "warmup_steps": 60}


def rows(cache, **settings):
    regime = load_regime({**PERM3, **settings})
    run = Run(load("grpo"), regime.train_config(steps=3, seed=0), regime.task, cache_dir=cache)
    return [run.start()] + [run.step().row for _ in range(3)]


def test_pass_at_k_leaves_the_training_rows_as_they_are(cache):
    off = rows(cache)
    on = rows(cache, pass_k=2, pass_samples=4)
    assert all("pass_at_k" not in row for row in off)
    # eval_every 2 and the last step: steps 0, 2 and 3 are evaluated, step 1 is not.
    assert [("pass_at_k" in row) for row in on] == [True, False, True, True]
    assert [{k: v for k, v in row.items() if k != "pass_at_k"} for row in on] == off
    for row in on:
        if "pass_at_k" in row:
            measured = row["pass_at_k"]
            assert (measured["k"], measured["n"]) == (2, 4)
            assert 0.0 <= measured["pass_at_k"] <= 1.0 and 0.0 <= measured["distinct_correct"] <= 4


def test_the_settings_refuse_more_k_than_samples():
    with pytest.raises(ValueError, match="needs at least as many pass_samples"):
        TrainConfig(pass_k=8, pass_samples=4)
    with pytest.raises(ValueError, match="warm_start_band"):
        TrainConfig(warm_start_band=(0.9, 0.1))
    assert TrainConfig().pass_k == 0 and TrainConfig().warm_start_band is None  # off by default
