"""Rank functions for test_spawned_ranks.py (a module of its own so that spawn can import it)."""

import os
import time


def all_reduced_tensor(rank: int, world: int, size: int):
    """A tensor of ``size`` values, all-reduced over a gloo group: every rank returns ``sum(range(world))``s."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    values = torch.full((size,), float(rank))
    dist.all_reduce(values)
    return {"rank": rank, "values": values}


def raises_on_rank_one(rank: int, world: int):
    if rank == 1:
        raise ValueError("rank one's own error")
    return rank


def exits_without_a_result(rank: int, world: int):
    os._exit(3)


def sleeps(rank: int, world: int):
    time.sleep(60)
