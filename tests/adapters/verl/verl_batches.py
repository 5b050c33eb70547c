"""Random verl-shaped inputs and configs shared by the verl adapter tests (real verl classes only)."""

from __future__ import annotations

import torch
from verl.workers.config import ActorConfig

from rlstab.adapters.verl import RlstabPolicyLossConfig


def actor_config(objective: str = "grpo", overrides: dict | None = None, **actor) -> ActorConfig:
    """A real verl ActorConfig whose policy loss is rlstab's."""
    policy_loss = RlstabPolicyLossConfig(objective=objective, overrides=overrides or {})
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
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = 0, T
    response_mask = torch.arange(T) < lengths.unsqueeze(-1)
    old = -torch.rand(B, T, generator=g) * 4.0
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
