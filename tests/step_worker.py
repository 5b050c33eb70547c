"""One gloo rank of tests/compiled/test_step.py's two-rank test (a module of its own so that spawn can import it)."""

import torch
import torch.distributed as dist

import rlstab

from batches import random_batch


def take(batch, lo, hi, leaf):
    fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    out = {k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
    out["logprobs"] = leaf[lo:hi]
    return rlstab.TokenBatch(**out)


def run_step(loss_fn, micro) -> tuple:
    """Gather the step's statistics over ``micro``, then each micro-batch's loss and backward with
    them: ``(stats, the summed loss)``."""
    stats = loss_fn.gather(micro)
    total = 0.0
    for mb in micro:
        out = loss_fn(mb, step=stats)
        out.loss.backward()
        total += out.loss.item()
    return stats, total


def rank_step(loss_fn, batch, splits, world: int) -> tuple:
    """This rank's share of a step on ``batch``, its micro-batches ``splits`` (``[(lo, hi), ...]``): ``(stats,
    the summed loss, the gradient of the log-probs averaged over the ranks)``, as DDP averages it."""
    leaf = batch.logprobs.detach().clone().requires_grad_()
    stats, total = run_step(loss_fn, [take(batch, lo, hi, leaf) for lo, hi in splits])
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    dist.all_reduce(grad)
    grad /= world
    return stats, total, grad


RANK_SPLITS = {0: [(0, 3), (3, 8)], 1: [(8, 8), (8, 16)]}  # rank 1 has an empty micro-batch


def run_rank(rank: int, world: int, name: str) -> tuple:
    """``(gradient averaged over ranks, thresholds, counts)`` of this rank (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    stats, _, grad = rank_step(rlstab.load(name).compile(), random_batch(B=16, T=24, seed=11), RANK_SPLITS[rank], world)
    thresholds = [None if t is None else t.item() for t in stats.thresholds]
    return grad, thresholds, stats.counts


