"""The command lines on the docs page are valid for verl 0.9.1: every override exists, and verl's
own start-up validation (``validate_config``) accepts the composed config with the objective.

The page has two: the 8 x 8 GPU run and the single-GPU one; both are found by their first line.
"""

import re
import shlex
from pathlib import Path

import pytest
import verl
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass, validate_config

from rlstab.adapters.verl import RlstabPolicyLossConfig

PAGE = Path(__file__).parents[3] / "docs" / "adapters" / "verl.md"
CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")


def documented_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\npython3 -m verl\.trainer\.main_ppo \\\n(.*?)```", PAGE.read_text(), re.S)
    return [shlex.split(block.replace("\\\n", " ")) for block in blocks]


COMMANDS = documented_commands()


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def test_the_page_has_the_cluster_and_the_single_gpu_command():
    sizes = [(c.count("trainer.nnodes=8"), c.count("trainer.n_gpus_per_node=8")) for c in COMMANDS]
    assert len(COMMANDS) == 2 and sizes[0] == (1, 1)
    single = COMMANDS[1]
    assert {"trainer.nnodes=1", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"} <= set(single)


@pytest.mark.parametrize("overrides", COMMANDS, ids=["cluster", "single-gpu"])
def test_documented_command_composes_and_passes_verls_validation(overrides):
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=rlstab" in overrides
    config = composed(overrides)
    validate_config(config, use_reference_policy=False, use_critic=False)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, RlstabPolicyLossConfig)
    assert actor.policy_loss.rlstab_objective.name == "stapo"
    # S2T reads the entropy: the command switches it on (without it, the actor check refuses the config)
    assert actor.calculate_entropy


def test_a_misspelt_rlstab_override_in_the_single_gpu_command_is_refused():
    """The check can fail: the same command with a misspelt objective field stops at config time."""
    overrides = [*COMMANDS[1], "+actor_rollout_ref.actor.policy_loss.overrides={masks: [{kind: s2t, tau_pp: 0.1}]}"]
    config = composed(overrides)
    with pytest.raises(Exception, match=r"masks\[0\]\.tau_pp: unknown field"):
        omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def test_the_single_gpu_steps_are_what_the_page_says():
    """32 prompts x 8 responses, mini-batches of 16 prompts (veRL counts them in prompts), micro-batches of 16."""
    actor = composed(COMMANDS[1]).actor_rollout_ref
    config = composed(COMMANDS[1])
    prompts, n = config.data.train_batch_size, actor.rollout.n
    steps = prompts // actor.actor.ppo_mini_batch_size
    responses = actor.actor.ppo_mini_batch_size * n
    said = f"{prompts} prompts x {n} responses and trains on them in {steps} optimizer steps of " \
           f"{actor.actor.ppo_mini_batch_size}\nprompts ({responses} responses, in micro-batches of " \
           f"{actor.actor.ppo_micro_batch_size_per_gpu})"
    assert (prompts, n, steps, responses) == (32, 8, 2, 128)
    assert said in PAGE.read_text()
