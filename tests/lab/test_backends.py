"""``rlstab.lab.backends``: which executor runs the jobs, and local workers leave with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rlstab.lab import backends

pytestmark = pytest.mark.skipif(not hasattr(os, "getppid") or sys.platform == "win32", reason="POSIX process ids")

# A parent that starts a pool of two workers as run_in_processes does, prints their process ids, then waits on a
# task that would take a minute; the test kills it (SIGKILL: nothing of the parent runs after it).
PARENT = textwrap.dedent("""
    import concurrent.futures as futures, multiprocessing, os, sys, time
    from rlstab.lab.backends import leave_with_parent
    context = multiprocessing.get_context("spawn")
    pool = futures.ProcessPoolExecutor(max_workers=2, mp_context=context, initializer=leave_with_parent,
                                       initargs=(os.getpid(),))
    pids = [pool.submit(os.getpid).result() for _ in range(4)]
    pool.submit(time.sleep, 60)
    print(" ".join(map(str, sorted(set(pids)))), flush=True)
    time.sleep(60)
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_workers_end_when_their_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
        assert workers and all(alive(p) for p in workers)  # not vacuous: they run while the parent does
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10 * backends.PARENT_POLL_S + 5
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in workers if alive(p)]
    finally:
        parent.kill()
    for p in left:  # before the fix the workers went on (a minute here, a whole run in the lab)
        os.kill(p, signal.SIGKILL)
    assert left == []


def test_a_worker_stays_while_its_parent_is_there():
    """The watch ends the process only on a changed parent id: here the parent is this test, which stays."""
    done = subprocess.run(
        [sys.executable, "-c", "import os, time; from rlstab.lab.backends import leave_with_parent; "
         "leave_with_parent(os.getppid()); time.sleep(3 * 0.5); print('stayed')"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "stayed"


def test_the_watch_ends_an_orphan():
    """Given a parent id that is not its parent's, the watch ends the process with status 1 at once."""
    done = subprocess.run(
        [sys.executable, "-c", "import os, time; from rlstab.lab.backends import leave_with_parent; "
         "leave_with_parent(os.getppid() + 1_000_000); time.sleep(30); print('stayed')"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "" and done.stderr == ""  # its own end, not an import error


# The backends' main job: which executor runs the jobs, each job given to ``execute`` with the same options.

JOBS = [("spec a", "folder a"), ("spec b", "folder b")]


def test_one_worker_or_none_runs_the_jobs_here_in_order(monkeypatch):
    calls = []

    def execute(spec, folder, **options):
        calls.append((spec, folder, options))
        return spec.upper()

    monkeypatch.setattr(backends, "execute", execute)
    for workers in (0, 1):
        assert backends.backend(workers, None) is backends.run_serially
    assert list(backends.backend(1, None)(JOBS, steps=3)) == [(JOBS[0], "SPEC A"), (JOBS[1], "SPEC B")]
    assert calls == [("spec a", "folder a", {"steps": 3}), ("spec b", "folder b", {"steps": 3})]


def test_several_workers_go_to_processes_and_an_address_to_ray(monkeypatch):
    monkeypatch.setattr(backends, "run_in_processes", lambda jobs, workers, **options: [("processes", workers, options)])
    monkeypatch.setattr(backends, "run_on_ray", lambda jobs, address, **options: [("ray", address, options)])
    assert backends.backend(4, None)(JOBS, steps=3) == [("processes", 4, {"steps": 3})]
    assert backends.backend(4, "ray://head:10001")(JOBS, steps=3) == [("ray", "ray://head:10001", {"steps": 3})]
    assert backends.backend(1, "auto")(JOBS) == [("ray", "auto", {})]  # an address wins over the worker count
    assert backends.backend(1, "") is backends.run_serially  # an empty address is no address


def test_ray_without_the_extra_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray gives: ImportError
    with pytest.raises(RuntimeError, match=r'^--ray-address needs Ray, which is not installed: pip install "rlstab\[ray\]"$'):
        next(backends.run_on_ray(JOBS, "auto"))
