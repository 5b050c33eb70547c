"""The setup hook, in a fresh process, puts the rlstab loss and the detached entropy into OpenRLHF's real trainer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlstab.adapters.openrlhf.config import (
    OBJECTIVE_ENV,
    STEP_STATISTICS_ENV,
    build_objective,
    objective_to_env,
)

from openrlhf_gpu_stubs import subprocess_env, write_stubs

SCRIPT = Path(__file__).with_name("openrlhf_training_step.py")
# STAPO with a probability threshold a 48-token vocabulary reaches, so that the S2T mask fires.
OBJECTIVE = build_objective(
    "stapo",
    {"masks": [{"kind": "s2t", "tau_p": 0.03, "entropy_quantile": 0.8, "population": "valid",
                "prob_source": "current", "entropy_side": "low"}]},
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One fresh process (imports cost ~20 s on two cores), both entropy settings."""
    tmp = tmp_path_factory.mktemp("training_step")
    out = tmp / "result.json"
    # training_step is called directly (not through ppo_train): each micro-batch is its own step
    env = subprocess_env(write_stubs(tmp / "stubs"), **{OBJECTIVE_ENV: objective_to_env(OBJECTIVE), STEP_STATISTICS_ENV: "local"})
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("entropy_coef", ["none", "0.0"], ids=["entropy-coef-unset", "entropy-coef-0"])
def test_setup_hook_makes_the_real_trainer_use_the_rlstab_loss(results, entropy_coef):
    r = results[entropy_coef]
    # ActorPPOTrainer.__init__ built rlstab's loss, a real PolicyLoss subclass, with the env's objective
    assert r["loss_class"] == "RlstabPolicyLoss" and r["is_policy_loss"]
    assert r["forward_wrapped"]
    # training_step's loss and gradients are rlstab's on exact, full-vocabulary entropy
    assert r["policy_loss"] == pytest.approx(r["expected_loss"], abs=1e-6)
    assert r["grad_norm"] == pytest.approx(r["expected_grad_norm"], rel=1e-5)
    assert r["metrics"]["entropy/mean"] == pytest.approx(r["exact_entropy_mean"], rel=1e-5)
    assert r["metrics"]["mask/s2t/silenced"] == r["expected_metrics"]["mask/s2t/silenced"] > 0
    assert r["metrics"]["mask/s2t/kept"] > 0
    # the entropy reaches the loss detached; the caller's output is as it asked; no_grad forwards untouched
    assert not r["attached_entropy_requires_grad"]
    assert r["output_has_entropy"] == (entropy_coef != "none") == r["entropy_loss_logged"]
    assert not r["no_grad_forward_has_entropy"]
    assert r["ppo_clip_ratio"] == 0.0  # on-policy: r = 1
    # rlstab's metrics ride in training_step's status, which OpenRLHF averages and logs itself
    assert r["logged_silenced"] == r["metrics"]["mask/s2t/silenced"] and r["logged_weight"] == "token"
