"""``parameter_gradients``: the batched backward (vmap over the weight vectors) gives the loop's gradients."""

from __future__ import annotations

import torch

from rlstab.demo.counterfactual_states import policy_for
from rlstab.trainer.mechanism.share import parameter_gradient, parameter_gradients
from rlstab.trainer.policy import Rollout
from rlstab.trainer.tasks import get_task


def test_batched_and_looped_gradients_are_equal():
    task = get_task("perm3")
    torch.manual_seed(0)
    policy = policy_for("tiny", task)
    prompts = [policy.codec.encode(p.prompt) for p in task.problems(3, torch.Generator().manual_seed(0))]
    rollout = policy.sample(prompts, max_new_tokens=4, temperature=1.0, generator=torch.Generator().manual_seed(1))
    logprobs, _ = policy.token_stats(Rollout(rollout.prompt_ids, rollout.response_ids, rollout.response_mask))
    params = policy.trainable_parameters()
    weights = torch.randn(4, *logprobs.shape, generator=torch.Generator().manual_seed(2)) * rollout.response_mask
    looped = torch.stack([parameter_gradient(logprobs, params, w) for w in weights])
    batched = parameter_gradients(logprobs, params, weights, batched=True)
    assert batched.shape == (4, sum(p.numel() for p in params)) and bool(looped.abs().sum(1).gt(0).all())
    torch.testing.assert_close(batched, looped, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(parameter_gradients(logprobs, params, weights), looped, rtol=0, atol=0)
