"""Choosing the objective in verl's own Hydra config, and the start-up checks.

The configs are composed from verl's real ``ppo_trainer.yaml`` with the Hydra overrides the docs
give, and converted the way verl's driver does in ``validate_config``
(``omega_conf_to_dataclass(config.actor_rollout_ref.actor)``), so an error here is an error
before any Ray worker starts.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import verl
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass

import rlstab
from rlstab.adapters.verl import RlstabPolicyLossConfig
from rlstab.adapters.verl.config import build_objective
from rlstab.errors import ConfigError
from rlstab.objective import Objective

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
ACTOR = "actor_rollout_ref.actor"
SELECT = [
    f"{ACTOR}.policy_loss._target_=rlstab.adapters.verl.RlstabPolicyLossConfig",
    f"{ACTOR}.policy_loss.loss_mode=rlstab",
    f"+{ACTOR}.policy_loss.objective=stapo",
]
BASE = [f"{ACTOR}.ppo_micro_batch_size_per_gpu=2"]


def actor(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=BASE + list(overrides))
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def test_import_verl_registers_rlstab_in_a_fresh_process():
    code = (
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
        "import verl.workers.engine_workers as workers, verl.workers.utils.losses as losses\n"
        "assert 'rlstab' in POLICY_LOSS_REGISTRY, sorted(POLICY_LOSS_REGISTRY)\n"
        "assert workers.ppo_loss is losses.ppo_loss and losses.ppo_loss.__rlstab_wrapped__\n"
        "print(POLICY_LOSS_REGISTRY['rlstab'].__module__)\n"
    )
    assert run_fresh(code) == "rlstab.adapters.verl.loss"


def run_fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter, with verl's plugin discovery on; its stdout."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_documented_overrides_build_the_objective():
    config = actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.overrides={{surrogate:{{eps_high:0.3}}}}")
    assert isinstance(config.policy_loss, RlstabPolicyLossConfig)
    objective = config.policy_loss.rlstab_objective
    assert objective.masks[0].kind == "s2t"
    assert objective.surrogate.eps_high == 0.3 and objective.surrogate.dual_clip == 10.0  # rest of dapo kept


def test_misspelt_override_fails_at_config_time_with_its_path():
    with pytest.raises(Exception, match=r"actor_rollout_ref\.actor\.policy_loss.*masks\[0\]\.tau_pp: unknown field"):
        actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.overrides={{masks:[{{kind:s2t,tau_pp:0.1}}]}}")


def test_out_of_range_value_names_path_and_value():
    with pytest.raises(Exception, match=r"surrogate\.eps_high = -0\.1"):
        actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.overrides={{surrogate:{{eps_high:-0.1}}}}")


def test_objective_that_reads_entropy_needs_calculate_entropy():
    with pytest.raises(Exception, match=r"masks\[0\] \(s2t\) reads the per-token entropy; set actor_rollout_ref\.actor\.calculate_entropy=True"):
        actor(*SELECT)
    # verl also computes entropy when the entropy bonus is on
    assert actor(*SELECT, f"{ACTOR}.entropy_coeff=0.001").policy_loss.objective == "stapo"


def test_loss_mode_without_target_and_target_without_loss_mode():
    with pytest.raises(Exception, match=r"loss_mode=rlstab needs actor_rollout_ref\.actor\.policy_loss\._target_="):
        actor(f"{ACTOR}.policy_loss.loss_mode=rlstab")
    with pytest.raises(Exception, match=r"loss_mode = 'vanilla'.*set actor_rollout_ref\.actor\.policy_loss\.loss_mode=rlstab"):
        actor(SELECT[0], SELECT[2])


def test_regularisers_that_verl_adds_itself_are_refused():
    with pytest.raises(Exception, match=r"regularisers\[0\] \(entropy_bonus\): not available in veRL.*entropy_coeff"):
        actor(*SELECT[:2], f"+{ACTOR}.policy_loss.objective=grpo",
              f"+{ACTOR}.policy_loss.overrides={{regularisers:[{{kind:entropy_bonus,coef:0.01}}]}}")


def test_unknown_preset():
    with pytest.raises(Exception, match=r"objective = 'stappo': neither a preset \(did you mean 'stapo'.*\) nor a \.yaml file"):
        actor(*SELECT[:2], f"+{ACTOR}.policy_loss.objective=stappo")


def test_whole_objective_inline_without_a_preset():
    config = actor(*SELECT[:2], f"+{ACTOR}.policy_loss.overrides={{aggregation:{{kind:token-mean,count:valid}}}}")
    assert config.policy_loss.rlstab_objective.aggregation.kind == "token-mean"


def test_step_statistics_is_checked():
    with pytest.raises(
        Exception, match=r"policy_loss\.step_statistics = 'global': allowed optimizer_step, local, data_parallel"
    ):
        actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.step_statistics=global")
    config = actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.step_statistics=data_parallel")
    assert config.policy_loss.step_statistics == "data_parallel"
    assert actor(*SELECT, f"{ACTOR}.calculate_entropy=True").policy_loss.step_statistics == "optimizer_step"  # the default


def test_step_level_components_that_need_rewards_are_refused():
    with pytest.raises(Exception, match=r"group_filter \(dynamic_sampling\) reads TokenBatch\.rewards: veRL computes rewards"):
        actor(*SELECT, f"{ACTOR}.calculate_entropy=True", f"+{ACTOR}.policy_loss.overrides={{group_filter:{{kind:dynamic_sampling}}}}")


def test_config_checks_compile_nothing(monkeypatch):
    """The checks read the objective's plan, so they need no torch of rlstab's own.

    ``import verl`` imports torch itself, so the test holds verl's checks to what keeps them torch-free
    (they never compile the objective); tests/adapters/openrlhf/test_config.py runs a launcher's
    checks without torch in sys.modules.
    """

    def compile_refused(self):
        raise AssertionError("a config check compiled the objective")

    monkeypatch.setattr(Objective, "compile", compile_refused)
    outcomes = {}
    for name in rlstab.preset_names():
        try:
            outcomes[name] = build_objective(name, {}).name
        except ConfigError:
            outcomes[name] = None
    assert outcomes["stapo"] == "stapo" and outcomes["four_layers"] is None  # accepted and refused both ran
    assert actor(*SELECT, f"{ACTOR}.calculate_entropy=True").policy_loss.rlstab_objective.name == "stapo"  # with check_actor
    with pytest.raises(Exception, match=r"masks\[0\] \(s2t\) reads the per-token entropy"):
        actor(*SELECT)
