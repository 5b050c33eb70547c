"""One gloo rank of test_expression.py's two-rank test (a module of its own so that spawn can import it).

The batch is large enough (about 10,000 valid tokens) that the entropy quantile takes the radix
path of rlstab.quantile.Population across ranks; the second quantile's population (the tokens with
A < 0, about half) is small enough to be gathered and sorted.
"""

import torch.distributed as dist

import rlstab

from batches import random_batch
from step_worker import rank_step

TEXT = (
    "advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8)"
    " or ratio > quantile(ratio, 0.95, advantage < 0)"
)
RANK_SPLITS = {0: [(0, 40), (40, 64)], 1: [(64, 64), (64, 128)]}  # rank 1 has an empty micro-batch


def batch():
    return random_batch(B=128, T=160, seed=3)


def objective():
    return rlstab.load({"masks": [{"kind": "expression", "silence": TEXT}],
                        "aggregation": {"kind": "token-mean", "count": "kept"}})


def run_rank(rank: int, world: int) -> tuple:
    """``(gradient averaged over ranks, thresholds, counts)`` of this rank (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    stats, _, grad = rank_step(objective().compile(), batch(), RANK_SPLITS[rank], world)
    (thresholds,) = stats.thresholds
    counts = (stats.counts.tokens_valid, stats.counts.tokens_kept)
    return grad.tolist(), [t.item() for t in thresholds], counts
