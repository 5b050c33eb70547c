"""Local workers leave with the process that started them (``rlstab.lab.backends.leave_with_parent``)."""

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
