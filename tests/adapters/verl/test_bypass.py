"""veRL's bypass mode keeps ``loss_mode=rlstab``: old_log_probs become the rollout's, the loss stays rlstab's."""

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import rollout_corr_helper

import rlstab.adapters.verl  # noqa: F401 - installs the wrapper


def batch(with_rollout=True):
    tensors = {"old_log_probs": torch.full((2, 3), -1.0), "responses": torch.zeros(2, 3, dtype=torch.long)}
    if with_rollout:
        tensors["rollout_log_probs"] = torch.tensor([[-0.5, -0.25, -2.0], [-1.5, -0.75, -3.0]])
    return DataProto.from_dict(tensors=tensors)


def test_an_rlstab_loss_stays_and_reads_the_rollouts_log_probs():
    data, policy_loss = batch(), OmegaConf.create({"loss_mode": "rlstab"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rollout_corr_helper.apply_bypass_mode(data, OmegaConf.create({"bypass_mode": True}), policy_loss)
    assert policy_loss.loss_mode == "rlstab"
    assert torch.equal(data.batch["old_log_probs"], data.batch["rollout_log_probs"])


def test_verls_bypass_settings_are_named_in_a_warning():
    corr = OmegaConf.create({"bypass_mode": True, "rollout_is": "token", "rollout_rs": None, "loss_type": "reinforce"})
    with pytest.warns(UserWarning, match=r"algorithm\.rollout_correction\.rollout_is=token, "
                                         r"algorithm\.rollout_correction\.loss_type=reinforce are veRL's bypass loss"):
        rollout_corr_helper.apply_bypass_mode(batch(), corr, OmegaConf.create({"loss_mode": "rlstab"}))


def test_without_rollout_log_probs_the_flag_to_set_is_named():
    with pytest.raises(ValueError, match="calculate_log_probs=true"):
        rollout_corr_helper.apply_bypass_mode(batch(False), None, OmegaConf.create({"loss_mode": "rlstab"}))


def test_another_loss_mode_gets_verls_own_bypass():
    policy_loss = OmegaConf.create({"loss_mode": "vanilla"})
    rollout_corr_helper.apply_bypass_mode(batch(), OmegaConf.create({"bypass_mode": True}), policy_loss)
    assert policy_loss.loss_mode == "bypass_mode"  # veRL's own behaviour, untouched
