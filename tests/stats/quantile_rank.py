"""One gloo rank of test_step_quantiles.py (a module of its own so that spawn can import it).

Each rank holds uneven micro-batches, one of them empty, of two populations: one large enough
(30,000 values) for the radix selection, one small enough (3,000) to be gathered and sorted; and
a step of the ``20-entropy`` and ``stapo`` presets with about 10,000 valid tokens (radix path)
through the compiled objective's ``gather``.
"""

import torch
import torch.distributed as dist

import rlstab
from rlstab.comm import Comm
from rlstab.quantile import INTERPOLATIONS, Population

from batches import random_batch
from step_worker import run_step, take

QS = (0.0, 0.001, 0.2, 0.5, 0.8, 0.999, 1.0)
PRESETS = ("20-entropy", "stapo")
VALUE_SPLITS = {0: [(0, 5000), (5000, 17000)], 1: [(17000, 17000), (17000, 17001), (17001, 30000)]}
BATCH_SPLITS = {0: [(0, 10), (10, 50)], 1: [(50, 50), (50, 51), (51, 96)]}  # rank 1: an empty micro-batch


def values(n: int = 30000):
    """Skewed (entropy-like), with negatives and many duplicates, and an include mask."""
    g = torch.Generator().manual_seed(5)
    x = torch.exp(1.2 * torch.randn(n, generator=g) - 1.5)
    x[::7] = -x[::7]
    x[: n // 5] = x[n // 2 : n // 2 + n // 5]
    include = torch.rand(n, generator=g) < 0.8
    return x, include


def batch():
    return random_batch(B=96, T=200, seed=7)


def quantiles(population: Population) -> dict:
    """Every (q, interpolation, mode) quantile of the population, as floats."""
    out = {}
    for q in QS:
        for interpolation in INTERPOLATIONS:
            for mode in ("exact", "histogram"):
                out[q, interpolation, mode] = population.quantile(q, interpolation, mode=mode).item()
    return out


def local_results(rank: int | None):
    """Sizes and quantiles of both populations over the given rank's chunks (None: all values, one chunk)."""
    x, include = values()
    small = include.clone()
    small[3000:] = False
    splits = [(0, len(x))] if rank is None else VALUE_SPLITS[rank]
    results = {}
    for name, inc in (("radix", include), ("sorted", small)):
        population = Population([(x[lo:hi], inc[lo:hi]) for lo, hi in splits], Comm())  # over the ranks when distributed
        results[name] = (population.size, quantiles(population))
    Population.ON_DEVICE = True  # the GPU's selection (bins as device tensors), here on CPU tensors
    try:
        for name, inc in (("radix", include), ("sorted", small)):
            population = Population([(x[lo:hi], inc[lo:hi]) for lo, hi in splits], Comm())
            results[f"{name} on device"] = (population.size, quantiles(population))
    finally:
        Population.ON_DEVICE = None
    return results


def step_results(rank: int | None, world: int = 1):
    """Per preset: thresholds, counts, loss and gradient of the step (whole step when rank is None)."""
    whole = batch()
    out = {}
    for name in PRESETS:
        loss_fn = rlstab.load(name).compile()
        leaf = whole.logprobs.detach().clone().requires_grad_()
        splits = [(0, whole.shape[0])] if rank is None else BATCH_SPLITS[rank]
        micro = [take(whole, lo, hi, leaf) for lo, hi in splits]
        stats, loss = run_step(loss_fn, micro)
        grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        if rank is not None:
            dist.all_reduce(grad)  # DDP averages gradients over ranks (so the step loss is the mean too)
            grad /= world
            total = torch.tensor(loss, dtype=torch.float64)
            dist.all_reduce(total)
            loss = total.item() / world
        c = stats.counts
        out[name] = dict(
            thresholds=[_plain(t) for t in stats.thresholds],
            counts=(c.tokens_valid, c.tokens_kept, c.sequences_valid, c.sequences_kept, c.max_length),
            loss=loss,
            grad=grad.tolist(),
        )
    return out


def _plain(threshold):
    """A threshold (0-d tensor, None, or a tuple of them) as floats."""
    if isinstance(threshold, tuple):
        return tuple(_plain(t) for t in threshold)
    return None if threshold is None else threshold.item()


def run_rank(rank: int, world: int) -> tuple:
    """``(local_results, step_results)`` of this rank (``rlstab.testing.spawned_ranks.run_ranks``)."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return local_results(rank), step_results(rank, world)
