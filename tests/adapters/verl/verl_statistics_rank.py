"""One gloo rank of test_step_statistics.py (a module of its own so that spawn can import it)."""

import torch
import torch.distributed as dist
from verl.workers.utils import losses

from verl_batches import actor_config, micro_batch

B, T = 6, 8


def full_step(seed: int = 3):
    """Six responses: log-probs (some below tau_p), entropies, advantages of both signs, lengths."""
    g = torch.Generator().manual_seed(seed)
    logprobs = torch.log(torch.rand(B, T, generator=g) * 0.5 + 0.0005)
    logprobs[:, ::3] = torch.log(torch.tensor(0.001))  # below tau_p = 0.002: S2T candidates
    entropy = torch.rand(B, T, generator=g)
    advantages = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.5, 1.5]).unsqueeze(-1).expand(B, T).contiguous()
    lengths = [8, 5, 7, 3, 8, 6]
    return logprobs, entropy, advantages, lengths


def run_rank(rank: int, world: int, scope: str) -> tuple:
    """``(rank, S2T threshold, gradient averaged over ranks)`` (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    logprobs, entropy, advantages, lengths = full_step()
    rows = slice(rank * B // world, (rank + 1) * B // world)
    total_valid = sum(lengths)
    model_output, data, leaf, _ = micro_batch(
        logprobs[rows], entropy[rows], advantages[rows], lengths[rows], [2] * (B // world),
        dp_size=world, batch_num_tokens=total_valid, global_batch_size=B,
    )
    config = actor_config("stapo", calculate_entropy=True)
    object.__setattr__(config.policy_loss, "step_statistics", scope)
    loss, metrics = losses.ppo_loss(config=config, model_output=model_output, data=data, dp_group=dist.group.WORLD)
    loss.backward()
    grad = torch.zeros(B, T)
    grad[rows] = leaf.grad
    dist.all_reduce(grad)
    grad /= world  # FSDP averages gradients over ranks
    threshold = metrics["actor/rlstab/mask/s2t/entropy_threshold"].aggregate()
    return rank, float(threshold), grad
