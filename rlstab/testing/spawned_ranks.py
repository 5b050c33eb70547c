"""Spawned processes as the ranks of a ``torch.distributed`` group: each rank's return value, by rank.

    results = run_ranks(my_rank_module.step, "stapo", world=2)  # my_rank_module.step(rank, 2, "stapo") per rank

The target is a top-level function of an importable module (a spawned process imports it afresh); it
runs with ``MASTER_ADDR``/``MASTER_PORT`` set, so ``init_process_group("gloo", rank=rank,
world_size=world)`` joins the others, and the default group is destroyed after it returns. Three things
make such a test flaky on a busy machine, and this module settles each once for every test and for
``rlstab.testing.ranks``:

- the port: a port the OS has just handed out as free (``free_port``, a bind to port 0), not one
  derived from the process id, which two concurrent runs can share;
- the results: a rank's return value crosses the queue as ``pickle.dumps`` bytes, that is by value.
  ``import torch`` registers tensor sharing with every multiprocessing queue, so a tensor put on a
  queue travels as a shared-memory file descriptor that the receiver fetches from the sender through a
  socket; when the rank has exited by then, the socket is gone and the parent's ``get`` raises
  ``FileNotFoundError``. Plain ``pickle`` copies the storage into the bytes instead;
- the waiting: the parent polls and fails at once, naming the rank, when a rank raises (its traceback)
  or exits without a result (its exit code), and when ``timeout_s`` passes (the ranks that gave
  nothing); the other ranks are then killed, since they may wait in a collective forever.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue as queues
import socket
import time
import traceback

POLL_S = 1.0  # how often the parent looks at the ranks while it waits
LAST_WORD_S = 2.0  # after a rank exits, how long its result may still take to come out of the pipe
JOIN_S = 30  # how long ranks that all reported may take to exit


class RankFailure(AssertionError):
    """A spawned rank raised, exited without a result, or gave none in time; ``rank`` names it (None: several)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no process holds now (the OS's choice for a bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, *args, world: int = 2, timeout_s: float = 300) -> list:
    """``[target(rank, world, *args) for rank in range(world)]``, each in a spawned process of one gloo group.

    Raises ``RankFailure`` naming the rank when one raises or dies, or the ranks without a result after
    ``timeout_s`` seconds.
    """
    ctx = multiprocessing.get_context("spawn")
    results_queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(target, rank, world, port, args, results_queue), daemon=True)
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    payloads: dict[int, bytes] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while len(payloads) < world:
            rank, ok, payload = _next(results_queue, procs, payloads, deadline, timeout_s)
            if not ok:
                raise RankFailure(f"rank {rank} of {world} raised:\n{payload}", rank)
            payloads[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=JOIN_S if len(payloads) == world else 0)
            if p.is_alive():
                p.kill()
                p.join()
    # Unpickled once the ranks are gone: a result that needed its rank alive fails here every time, not now and then.
    return [pickle.loads(payloads[rank]) for rank in range(world)]


def _next(results_queue, procs, results: dict, deadline: float, timeout_s: float) -> tuple:
    """The next rank's message; ``RankFailure`` when a rank exited without one or time is up."""
    while True:
        try:
            return results_queue.get(timeout=POLL_S)
        except queues.Empty:
            pass
        for rank, p in enumerate(procs):
            if rank not in results and p.exitcode is not None:
                try:  # its message may still be on its way through the pipe
                    return results_queue.get(timeout=LAST_WORD_S)
                except queues.Empty:
                    raise RankFailure(
                        f"rank {rank} of {len(procs)} exited (exit code {p.exitcode}) without a result", rank
                    ) from None
        if time.monotonic() > deadline:
            missing = [rank for rank in range(len(procs)) if rank not in results]
            raise RankFailure(
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {len(procs)} "
                f"gave no result in {timeout_s:g} s",
                missing[0] if len(missing) == 1 else None,
            )


def _rank_main(target, rank: int, world: int, port: int, args: tuple, results_queue) -> None:
    """In the spawned process: run ``target`` and put ``(rank, ok, pickled result or traceback)`` on the queue."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        message = (rank, True, pickle.dumps(target(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - the parent must hear of any failure, not wait for it
        message = (rank, False, traceback.format_exc())
    try:
        results_queue.put(message)
    finally:
        from rlstab.lazy import distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
