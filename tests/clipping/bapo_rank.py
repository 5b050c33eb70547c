"""One gloo rank of test_bapo.py's two-rank test (a module of its own so that spawn can import it)."""

import torch
import torch.distributed as dist
from clipping.cases import off_policy_batch

import rlstab

SURROGATE = {"kind": "bapo", "target": 0.5}
RANK_SPLITS = {0: [(0, 5), (5, 7)], 1: [(7, 12)]}


def objective():
    return rlstab.load({"surrogate": SURROGATE, "aggregation": {"kind": "token-mean", "count": "valid"}})


def take(batch, lo, hi, leaf):
    fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    out = {k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
    out["logprobs"] = leaf[lo:hi]
    return rlstab.TokenBatch(**out)


def run_rank(rank: int, world: int) -> tuple:
    """``(BAPO's step value, state, gradient averaged over ranks)`` of this rank (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    batch = off_policy_batch(5, spread=1.0)
    loss_fn = objective().compile()
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = [take(batch, lo, hi, leaf) for lo, hi in RANK_SPLITS[rank]]
    stats = loss_fn.gather(micro)
    for mb in micro:
        loss_fn(mb, step=stats).loss.backward()
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    dist.all_reduce(grad)  # DDP averages gradients over ranks
    grad /= world
    return stats.hooks[-1], loss_fn.state_dict(), grad
