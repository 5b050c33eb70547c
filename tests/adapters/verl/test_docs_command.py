"""The command line on the docs page is valid for verl 0.9.1: every override exists, and verl's
own start-up validation (``validate_config``) accepts the composed config with the objective."""

import re
import shlex
from pathlib import Path

import verl
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass, validate_config

from rlstab.adapters.verl import RlstabPolicyLossConfig

PAGE = Path(__file__).parents[3] / "docs" / "adapters" / "verl.md"
CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


def documented_overrides() -> list[str]:
    block = re.search(r"```bash\npython3 -m verl\.trainer\.main_ppo \\\n(.*?)```", PAGE.read_text(), re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


def test_documented_command_composes_and_passes_verls_validation():
    overrides = documented_overrides()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=rlstab" in overrides
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    validate_config(config, use_reference_policy=False, use_critic=False)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, RlstabPolicyLossConfig)
    assert actor.policy_loss.rlstab_objective.name == "stapo"
