"""The example plugin (examples/rlstab-wreinforce) inside TRL 1.16.0's real ``GRPOTrainer._compute_loss``.

``RlstabGRPOTrainer`` is given an objective naming ``kind: w_reinforce``; rlstab finds that kind only
through the plugin's ``rlstab.components`` entry point (the distribution must be installed in this
environment: ``pip install ./examples/rlstab-wreinforce``; scripts/test.sh does). TRL has no
W-REINFORCE of its own, but its ``dapo`` loss is PPO clip (``epsilon_high = epsilon = 0.2``, no
``delta``) with token-mean over the window's tokens, and that loss is linear in a positive scale of
each advantage: TRL's own ``_compute_loss`` on advantages with every positive one multiplied by
lambda is W-REINFORCE's loss. The two trainers are compared on that: loss and every parameter's
gradient at 1e-6.
"""

import pytest
import rlstab_wreinforce  # noqa: F401 - installed by scripts/test.sh; a missing plugin is a failure, not a skip
import torch

import rlstab

from trl_tiny import crafted_inputs, loss_and_grads, trainer_pair

OBJECTIVE = {
    "extends": "grpo",
    "surrogate": {"dual_clip": None},
    "reweighters": [{"kind": "w_reinforce", "positive_weight": 0.1}],
}


def test_the_kind_comes_from_the_entry_point():
    objective = rlstab.load(OBJECTIVE)
    assert type(objective.reweighters[0]).__module__ == "rlstab_wreinforce.w_reinforce"


@pytest.mark.parametrize("accumulation", [(1, 1, None), (2, 2, 57.0)])
def test_w_reinforce_is_trls_dapo_loss_on_down_weighted_positive_advantages(tmp_path, accumulation):
    ga, spg, items = accumulation
    shared = {"gradient_accumulation_steps": ga, "steps_per_generation": spg}
    theirs, ours = trainer_pair(tmp_path, OBJECTIVE, {"loss_type": "dapo", **shared}, shared)
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed, num_items_in_batch=items)
        weighted = dict(inputs)
        advantages = inputs["advantages"]
        weighted["advantages"] = torch.where(advantages > 0, 0.1 * advantages, advantages)
        loss, grads = loss_and_grads(theirs, weighted, ga)
        our_loss, our_grads = loss_and_grads(ours, inputs, ga)
        torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
        assert grads.keys() == our_grads.keys()
        for name in grads:
            torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
        plain, _ = loss_and_grads(theirs, inputs, ga)
        assert (plain - loss).abs() > 1e-4  # the weight did change TRL's loss: the comparison can fail
