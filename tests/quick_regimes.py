"""Small, fast regimes for the lab's tests: a few prompts, a 100-step warm start (a few correct samples per step, so the loss has a signal), a tiny held-out set."""

QUICK = {"name": "quick", "prompts_per_step": 4, "group_size": 8, "eval_size": 16, "eval_every": 2, "warmup_steps": 100}
# Policy lag 1 at a high learning rate: ratios and rollout importance weights differ from 1 from step 2.
QUICK_LAG = {**QUICK, "name": "quick-lag", "policy_lag": 1, "lr": 1e-3}


def without_time(rows):
    """Rows with the measured step time left out: everything else must be identical."""
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]
