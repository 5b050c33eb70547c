"""A plugin component inside verl's real ``ppo_loss``, brought in by nothing but its entry point.

The example plugin (``examples/rlstab-wreinforce``, installed in this environment) declares
W-REINFORCE's weight in the ``rlstab.components`` group. A fresh Python process builds verl's actor
config with the plugin's objective file and runs ``ppo_loss`` with ``loss_mode=rlstab``: it never
imports the plugin or calls ``rlstab.register``, so only the entry point can make
``kind: w_reinforce`` known, as in a Ray worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
OBJECTIVE = ROOT / "examples" / "rlstab-wreinforce" / "w_reinforce.yaml"

CHILD = r"""
import json, sys
import torch
from verl.workers.utils import losses
from verl_batches import actor_config, micro_batch

assert "rlstab_wreinforce" not in sys.modules
logprobs = torch.log(torch.tensor([[0.5, 0.4, 1.0], [0.2, 0.6, 0.5]]))
old = torch.log(torch.tensor([[0.25, 0.4, 1.0], [0.2, 0.3, 0.5]]))
advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
model_output, data, leaf, _ = micro_batch(logprobs, torch.zeros(2, 3), advantages, [2, 3], [2, 3], old_logprobs=old)
config = actor_config(sys.argv[1], loss_agg_mode="token-mean")
loss, metrics = losses.ppo_loss(config=config, model_output=model_output, data=data, dp_group=None)
loss.backward()
assert "rlstab_wreinforce" in sys.modules  # loaded by the registry, from the entry point
print(json.dumps({"loss": loss.item(), "grad": leaf.grad.tolist()}))
"""


def test_w_reinforce_from_its_entry_point_runs_in_verls_ppo_loss():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    env.pop("RLSTAB_IN_PROCESS_KINDS", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(OBJECTIVE)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    # PPO clip 0.2 (no dual-clip), token-mean over the 5 valid tokens, each token's loss times
    # w = 0.1 where A > 0 (row 0), 1 where A < 0 (row 1).
    # Row 0 (A = +1): r = 0.5/0.25 = 2 -> clipped at 1.2: l = -1.2 (no gradient); r = 0.4/0.4 = 1: l = -1,
    #   dl/dlogp = -A r = -1. Weighted: 0.1 * (-1.2 - 1) = -0.22.
    # Row 1 (A = -1): r = 0.2/0.2 = 1: l = 1, dl/dlogp = 1; r = 0.6/0.3 = 2: max(2, 1.2) = 2 (unclipped),
    #   dl/dlogp = r = 2; r = 0.5/0.5 = 1: l = 1, dl/dlogp = 1. Sum: 4.
    # loss = (-0.22 + 4) / 5 = 0.756
    assert out["loss"] == pytest.approx(0.756, rel=1e-5)
    expected = [[0.0, -0.1 / 5, 0.0], [1 / 5, 2 / 5, 1 / 5]]
    for got, want in zip(out["grad"], expected):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
