"""One gloo rank of test_bapo.py's two-rank test (a module of its own so that spawn can import it)."""

import torch.distributed as dist
from clipping.cases import off_policy_batch

import rlstab

from step_worker import rank_step

SURROGATE = {"kind": "bapo", "target": 0.5}
RANK_SPLITS = {0: [(0, 5), (5, 7)], 1: [(7, 12)]}


def objective():
    return rlstab.load({"surrogate": SURROGATE, "aggregation": {"kind": "token-mean", "count": "valid"}})


def run_rank(rank: int, world: int) -> tuple:
    """``(BAPO's step value, state, gradient averaged over ranks)`` of this rank (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    loss_fn = objective().compile()
    stats, _, grad = rank_step(loss_fn, off_policy_batch(5, spread=1.0), RANK_SPLITS[rank], world)
    return stats.hooks[-1], loss_fn.state_dict(), grad
