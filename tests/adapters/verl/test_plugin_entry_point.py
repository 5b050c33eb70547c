"""A plugin component inside verl's real ``ppo_loss``, brought in by nothing but its entry point.

The example plugin (``examples/rlstab-vespo``, installed in this environment) declares VESPO in the
``rlstab.components`` group. A fresh Python process builds verl's actor config with the plugin's
objective file and runs ``ppo_loss`` with ``loss_mode=rlstab``: it never imports the plugin or calls
``rlstab.register``, so only the entry point can make ``kind: vespo`` known, as in a Ray worker.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
OBJECTIVE = ROOT / "examples" / "rlstab-vespo" / "vespo.yaml"

CHILD = r"""
import json, sys
import torch
from verl.workers.utils import losses
from verl_batches import actor_config, micro_batch

assert "rlstab_vespo" not in sys.modules
logprobs = torch.log(torch.tensor([[0.5, 0.4, 1.0], [0.2, 0.6, 0.5]]))
old = torch.log(torch.tensor([[0.25, 0.4, 1.0], [0.2, 0.3, 0.5]]))
advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
model_output, data, leaf, _ = micro_batch(logprobs, torch.zeros(2, 3), advantages, [2, 3], [2, 3], old_logprobs=old)
config = actor_config(sys.argv[1], loss_agg_mode="token-mean")
loss, metrics = losses.ppo_loss(config=config, model_output=model_output, data=data, dp_group=None)
loss.backward()
assert "rlstab_vespo" in sys.modules  # loaded by the registry, from the entry point
print(json.dumps({"loss": loss.item(), "grad": leaf.grad.tolist()}))
"""


def test_vespo_from_its_entry_point_runs_in_verls_ppo_loss():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    env.pop("RLSTAB_IN_PROCESS_KINDS", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(OBJECTIVE)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    # VESPO: w = prod_t r_t over the response, phi = exp(lambda + k log w - lambda w), l_t = -phi A logp_t,
    # token-mean over the 5 valid tokens. Row 0 (A = +1: k 2, lambda 3): w = 0.5/0.25 = 2,
    # phi0 = e^3 * 2^2 * e^-6 = 4e^-3. Row 1 (A = -1: k 3, lambda 2): w = 0.6/0.3 = 2, phi1 = e^2 * 2^3 * e^-4 = 8e^-2.
    phi0, phi1 = 4 * math.exp(-3), 8 * math.exp(-2)
    row0 = -phi0 * (math.log(0.5) + math.log(0.4))
    row1 = phi1 * (math.log(0.2) + math.log(0.6) + math.log(0.5))
    assert out["loss"] == pytest.approx((row0 + row1) / 5, rel=1e-5)
    # d l_t / d logp_t = -phi A, over 5 tokens; padding gets nothing.
    expected = [[-phi0 / 5, -phi0 / 5, 0.0], [phi1 / 5, phi1 / 5, phi1 / 5]]
    for got, want in zip(out["grad"], expected):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
