"""Random verl-shaped inputs and configs shared by the verl adapter tests (real verl classes only)."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.utils.padding import left_right_2_no_padding

from rlstab.adapters.verl import RlstabPolicyLossConfig


def actor_config(
    objective: str = "grpo", overrides: dict | None = None, step_statistics: str = "local", **actor
) -> ActorConfig:
    """A real verl ActorConfig whose policy loss is rlstab's.

    ``step_statistics`` is ``local``: these tests call ``ppo_loss`` directly, outside the
    ``TrainingWorker.train_batch`` that gathers the default mode's step statistics, so each call
    is its own step (as in verl's own losses, which the conformance tests compare against).
    """
    policy_loss = RlstabPolicyLossConfig(objective=objective, overrides=overrides or {}, step_statistics=step_statistics)
    fields = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1, "policy_loss": policy_loss}
    fields.update(actor)
    return ActorConfig(**fields)


def vanilla_config(**actor) -> ActorConfig:
    fields = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1}
    fields.update(actor)
    return ActorConfig(**fields)


def random_verl_batch(seed: int, B: int = 6, T: int = 11) -> dict[str, torch.Tensor]:
    """[B, T] float32 tensors as verl's ppo_loss hands them to a policy loss.

    Ragged responses (one row empty, one full), log-ratios spread to +-2 so that both clip
    sides and dual-clip are hit, token-level advantages of both signs (as verl broadcasts them).
    Every log-prob at most 0: the old ones within [-6, -2], so that the current ones are too.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = 0, T
    response_mask = torch.arange(T) < lengths.unsqueeze(-1)
    old = -torch.rand(B, T, generator=g) * 4.0 - 2.0
    log_prob = old + (torch.rand(B, T, generator=g) * 4.0 - 2.0)
    advantages = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    advantages[1] = torch.randn(T, generator=g)  # one row with per-token advantages
    return {
        "old_log_prob": old,
        "log_prob": log_prob,
        "advantages": advantages,
        "response_mask": response_mask,
        "rollout_is_weights": torch.rand(B, T, generator=g) * 2.0,
    }


P = 3  # prompt columns (left padded)


def micro_batch(
    logprobs, entropy, advantages, response_lengths, prompt_lengths, dp_size=1, batch_num_tokens=None, global_batch_size=None,
    old_logprobs=None,
):
    """(model_output, data, logprob leaf, response mask) for verl's ppo_loss, built as verl's trainer builds them.

    logprobs/entropy/advantages/old_logprobs are [B, T] response values (old: the current ones unless
    given); the global batch info defaults to this micro-batch's.
    """
    B, T = logprobs.shape
    response_mask = torch.arange(T) < torch.tensor(response_lengths).unsqueeze(-1)
    prompt_mask = torch.arange(P) >= P - torch.tensor(prompt_lengths).unsqueeze(-1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    input_ids = torch.randint(3, 50, (B, P + T)) * attention_mask
    data = TensorDict(
        {
            "prompts": input_ids[:, :P],
            "responses": input_ids[:, P:],
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask.long(),
            "old_log_probs": (logprobs if old_logprobs is None else old_logprobs).detach().clone(),
            "advantages": advantages,
        },
        batch_size=[B],
    )
    data = left_right_2_no_padding(data)
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=int(response_mask.sum()) if batch_num_tokens is None else batch_num_tokens,
        global_batch_size=B if global_batch_size is None else global_batch_size,
    )

    # The engine's outputs: one value per token of prompt + response, shifted left by one
    # (position p - 1 + t predicts response token t).
    def nested(values):
        rows = []
        for i in range(B):
            row = torch.zeros(prompt_lengths[i] + response_lengths[i])
            row[prompt_lengths[i] - 1 : prompt_lengths[i] - 1 + response_lengths[i]] = values[i, : response_lengths[i]]
            rows.append(row)
        return torch.nested.nested_tensor_from_jagged(torch.cat(rows), offsets=data["input_ids"].offsets())

    leaf = logprobs.detach().clone().requires_grad_()
    model_output = {"log_probs": nested(leaf), "entropy": nested(entropy)}
    return model_output, data, leaf, response_mask
