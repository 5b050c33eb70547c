"""Where runs execute: this process, local worker processes, or Ray tasks on a cluster.

Every backend calls the same function (``rlstab.lab.run.execute``) with the same arguments, each
run on one torch thread, so a run's metrics do not depend on the backend or the worker count.
Local workers are spawned processes (not forked: torch's thread pools do not survive a fork), and
each leaves when the process that started it is gone (:func:`leave_with_parent`): ``kill`` of an
``rlstab compare`` stops its runs too, where they would otherwise go on writing into its ``--out``.
Ray is an extra (``pip install "rlstab[ray]"``) imported only when ``ray_address`` is given; each run is a
Ray task asking for one CPU. On a cluster of several machines ``--out`` should be storage every
node sees: the run then checkpoints where a rerun finds it. Otherwise the driver still writes each
finished run's metrics and summary, but an interrupted run restarts from step 0.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rlstab.lab.run import execute
from rlstab.lab.spec import RunSpec

Job = tuple[RunSpec, Path]
PARENT_POLL_S = 0.5
"""How often a worker checks that the process that started it is still there."""


def leave_with_parent(parent: int) -> None:
    """A worker's initializer: a daemon thread that ends this process once its parent ``parent`` is gone.

    A signal that kills the parent (``kill``, the OOM killer) reaches the workers of a process pool
    only when sent to the whole process group (Ctrl-C is), and a parent that dies without its
    ``finally`` (SIGKILL, an unhandled SIGTERM) cannot stop them; an orphaned worker is re-parented,
    so its parent process id changes. Its run ends where it is: checkpoints are written atomically
    (``rlstab.lab.checkpoint``), and a rerun of the same command resumes from the last one.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="rlstab-leave-with-parent", daemon=True).start()


def run_serially(jobs: Sequence[Job], **options) -> Iterator[tuple[Job, dict]]:
    for job in jobs:
        yield job, execute(job[0], job[1], **options)


def run_in_processes(jobs: Sequence[Job], workers: int, **options) -> Iterator[tuple[Job, dict]]:
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=leave_with_parent,
                                     initargs=(os.getpid(),)) as pool:
        pending = {pool.submit(execute, spec, folder, **options): (spec, folder) for spec, folder in jobs}
        try:
            for done in futures.as_completed(pending):
                yield pending[done], done.result()
        except BaseException:
            for f in pending:
                f.cancel()
            raise


def run_on_ray(jobs: Sequence[Job], address: str, **options) -> Iterator[tuple[Job, dict]]:
    try:
        import ray
    except ImportError:
        raise RuntimeError('--ray-address needs Ray, which is not installed: pip install "rlstab[ray]"') from None
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=0)(execute)
    pending = {remote.remote(spec, str(folder), **options): (spec, folder) for spec, folder in jobs}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(ready[0])
        yield job, ray.get(ready[0])


def backend(workers: int, ray_address: str | None) -> Callable[..., Iterator[tuple[Job, dict]]]:
    """The executor for ``workers`` local processes, or for Ray at ``ray_address``."""
    if ray_address:
        return lambda jobs, **options: run_on_ray(jobs, ray_address, **options)
    if workers <= 1:
        return run_serially
    return lambda jobs, **options: run_in_processes(jobs, workers, **options)
