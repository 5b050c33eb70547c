"""How the sections time, free memory, compare with float64 and name a failure.

Timing: CUDA events on CUDA, with the queue drained before each call, so that a call's time
includes the launches and syncs of its host code; ``time.perf_counter`` on CPU.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable

import torch

from gpu_sections.common import SLICE


class Timer:
    """Milliseconds of one call: CUDA events on CUDA (the queue drained first), perf_counter on CPU.

    ``timer(fn)`` runs ``fn`` and returns a function giving its time; on CUDA read them after
    ``timer.sync()`` (one synchronisation for a whole round of calls).
    """

    def __init__(self, device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], object]) -> Callable[[], float]:
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            return lambda: start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return lambda: ms


def interleaved(timer: Timer, calls: dict, repeats: int, label: str) -> dict[str, float]:
    """Median ms of each ``(prepare, call)``: every repeat runs every call in turn, the order
    reversed on odd repeats so that none always runs first. ``prepare`` is not timed."""
    times: dict[str, list] = {name: [] for name in calls}
    names = list(calls)
    tty = sys.stdout.isatty()
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            prepare, call = calls[name]
            prepare()
            times[name].append(timer(call))
        if tty:
            print(f"  {label}: repeat {i + 1}/{repeats}", end="\r", flush=True)
    if tty:
        print(" " * 60, end="\r", flush=True)
    timer.sync()
    return {name: statistics.median(read() for read in reads) for name, reads in times.items()}


def free() -> None:
    """Collect garbage and hand the CUDA allocator's cached blocks back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def failure(exc: BaseException) -> str:
    """A path's status when it raised: ``failed: <type>: <first line>`` (what the exit status counts)."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"failed: {type(exc).__name__}: {first}"


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


def max_error(value, ref):
    """The largest absolute difference of the first ``SLICE`` values from their float64 reference."""
    if value is None or ref is None:
        return None
    return float((value.detach()[:SLICE].double() - ref).abs().max())
