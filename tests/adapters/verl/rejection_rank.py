"""One gloo rank of test_rejection.py (a module of its own so that spawn can import it)."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import rlstab
from rlstab.adapters.global_counts import counted
from rlstab.adapters.verl.counts import step_stats, with_trainer_counts
from rlstab.adapters.verl.inputs import token_batch

B, T = 8, 7


def full_step(seed: int = 5) -> dict[str, torch.Tensor]:
    """Eight responses whose rollout log-probs get some tokens, and one whole response, rejected."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(B, T, generator=g) * 0.5 + 0.0005)
    old[:, ::3] = torch.log(torch.tensor(0.001))  # below stapo's tau_p: S2T candidates
    lengths = torch.tensor([7, 3, 5, 7, 2, 6, 4, 7])
    mask = torch.arange(T) < lengths.unsqueeze(-1)
    rollout = old + torch.randn(B, T, generator=g) * 0.02
    rollout[torch.rand(B, T, generator=g) < 0.25] -= 1.5  # token level: k1 outside [1/2, 2]
    rollout[5] = old[5] - 0.5  # sequence level: mean k3 of row 5 is 0.149 > 0.02
    return {
        "old_log_prob": old,
        "log_prob": old + torch.randn(B, T, generator=g) * 0.3,
        "advantages": torch.randn(B, 1, generator=g).expand(B, T).contiguous(),
        "response_mask": mask,
        "entropy": torch.rand(B, T, generator=g),
        "rollout_log_probs": rollout,
    }


def batch_of(step: dict[str, torch.Tensor], rows, leaf: torch.Tensor | None = None) -> rlstab.TokenBatch:
    """The rows of the step as veRL's loss maps them, plus the rollout log-probs veRL's loss is not given."""
    batch = token_batch(
        log_prob=step["log_prob"][rows] if leaf is None else leaf,
        old_log_prob=step["old_log_prob"][rows],
        advantages=step["advantages"][rows],
        response_mask=step["response_mask"][rows],
        entropy=step["entropy"][rows],
    )
    return dataclasses.replace(batch, rollout_logprobs=step["rollout_log_probs"][rows])


def run_rank(rank: int, world: int, objective: dict, scope: str):
    """One rank's ``(loss, loss without the shared valid counts, gradient)``, each summed or averaged over ranks."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    step = full_step()
    mine = range(rank * B // world, (rank + 1) * B // world)
    parts = [list(mine)] if scope == "data_parallel" else [list(mine)[:2], list(mine)[2:]]
    # veRL's global_batch_info: its all-reduced response-mask tokens and the mini-batch's responses.
    info = {"dp_size": world, "batch_num_tokens": step["response_mask"].sum().item(), "global_batch_size": B,
            "loss_scale_factor": None}
    compiled = rlstab.load(objective).compile()
    group = dist.group.WORLD
    if scope == "optimizer_step":  # as the step scope: one gather over every micro-batch of every rank
        batches = [batch_of(step, rows) for rows in parts]
        stats = compiled.gather(batches, group=group)
        scope_counts = counted(compiled, batches, group=group)
    grad = torch.zeros(B, T)
    totals = torch.zeros(2)
    for rows in parts:
        leaf = step["log_prob"][rows].clone().requires_grad_()
        batch = batch_of(step, rows, leaf)
        if scope == "optimizer_step":
            own = with_trainer_counts(stats, info, stats.counts.max_length, scope_counts)
            unshared = with_trainer_counts(stats, info, stats.counts.max_length)
        else:  # step_statistics=data_parallel: this micro-batch on every rank
            own = step_stats(compiled, batch, info, across_ranks=True, group=group)
            unshared = with_trainer_counts(compiled.gather([batch], group=group, distributed=True), info, T)
        out = compiled(batch, step=own)
        out.loss.backward()
        grad[rows] = leaf.grad
        totals += torch.tensor([out.loss.item(), compiled(batch, step=unshared).loss.item()])
    dist.all_reduce(grad)
    dist.all_reduce(totals)
    # FSDP averages gradients over ranks; each rank's loss carries the factor dp_size that undoes it.
    return (totals / world).tolist(), grad / world
