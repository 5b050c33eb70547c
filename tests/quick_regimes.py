"""Small, fast regimes for the lab's tests: a few prompts, a 100-step warm start (a few correct samples per step, so the loss has a signal), a tiny held-out set."""

import pytest

QUICK = {"name": "quick", "prompts_per_step": 4, "group_size": 8, "eval_size": 16, "eval_every": 2, "warmup_steps": 100}
# Policy lag 1 at a high learning rate: ratios and rollout importance weights differ from 1 from step 2.
QUICK_LAG = {**QUICK, "name": "quick-lag", "policy_lag": 1, "lr": 1e-3}


def without_time(rows):
    """Rows with the measured step time left out: everything else must be identical."""
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]


@pytest.fixture
def cache(tmp_path_factory):
    """One warm-start cache for every test of the session that trains (the quick regimes' warm starts)."""
    return tmp_path_factory.getbasetemp() / "lab-warmstart-cache"
