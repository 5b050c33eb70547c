"""Random OpenRLHF-shaped micro-batches and OpenRLHF's own PolicyLoss, shared by the adapter tests."""

from __future__ import annotations

import torch

from rlstab.adapters.openrlhf.source import loss_module


def openrlhf_policy_loss(**kwargs):
    """OpenRLHF 0.11.2's real PolicyLoss (the installed openrlhf/models/loss.py)."""
    return loss_module().PolicyLoss(**kwargs)


def random_micro_batch(seed: int, B: int = 6, T: int = 11, spread: float = 2.0) -> dict[str, torch.Tensor]:
    """[B, T] float32 tensors as ``training_step`` hands them to the loss.

    Ragged responses (one empty, one full), log-ratios spread to +-``spread`` so that both clip
    sides and dual-clip are hit, per-token advantages (OpenRLHF broadcasts per-response ones)
    with one response of mixed signs, rollout log-probs near the old ones, log-probs zeroed on
    padding as ``Actor.forward`` returns them. Every log-prob at most 0: the old ones within
    ``[-4 - spread, -spread]``.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = 0, T
    action_mask = torch.arange(T) < lengths.unsqueeze(-1)
    old = -torch.rand(B, T, generator=g) * 4.0 - spread
    log_probs = old + (torch.rand(B, T, generator=g) * 2 * spread - spread)
    advantages = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    advantages[1] = torch.randn(T, generator=g)
    rollout = old + 0.6 * torch.randn(B, T, generator=g)
    return {
        "log_probs": log_probs * action_mask,
        "old_log_probs": old * action_mask,
        "advantages": advantages * action_mask,
        "action_mask": action_mask,
        "rollout_log_probs": rollout.clamp(max=-1e-3) * action_mask,
    }
