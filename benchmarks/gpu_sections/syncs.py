"""Section 5 of ``benchmarks/gpu.py``: kernels and host synchronisations per loss call + backward.

At 4M tokens, the losses of the loss section, counted three ways: ``torch.profiler`` (what is
counted is ``COUNTED``), ``torch.cuda.set_sync_debug_mode("warn")``, and
``rlstab.testing.syncs.host_syncs()``; then every preset's frozen-step and whole-step call under
``host_syncs()``. Both parts need rlstab's components registered (the command checks that first).
"""

from __future__ import annotations

import math
import os
import re
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from functools import partial

import torch

import rlstab
from gpu_sections.before import BEFORE
from gpu_sections.common import DRY_NOTE, ROOT, cell, fmt_tokens, log
from gpu_sections.loss import loss_calls
from gpu_sections.measure import Timer, failure, free
from gpu_sections.report import Report

SYNC_CALLS = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cuMemcpyDtoH",
    "cuMemcpy",
}
LAUNCH_CALLS = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
}
ATEN_SYNCS = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique2",
    "aten::bincount",
    "aten::repeat_interleave",
}
COUNTED = (
    "kernels: the profiler's device events that are neither Memcpy nor Memset; launches: runtime and driver "
    f"launch calls ({', '.join(sorted(LAUNCH_CALLS))}); host syncs: runtime and driver calls that block the host "
    f"({', '.join(sorted(SYNC_CALLS))}), each by name; dtoh: device-to-host copies; aten: the ops that read a value "
    "or size on the host (aten::_local_scalar_dense is what item(), bool(), float() dispatch to; nonzero, masked_select, "
    "unique, bincount, repeat_interleave); all over one call + backward, inside a record_function range"
)
MEASURED = "gpu.py: one call + backward"


def profile_counts(step: Callable[[], None], timer: Timer) -> dict:
    """``count_events`` of one ``step()`` under ``torch.profiler``, inside a ``MEASURED`` range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if timer.cuda else [])
    timer.sync()
    with profile(activities=activities) as prof:
        with record_function(MEASURED):
            step()
        timer.sync()
    return count_events(list(prof.events()), timer.cuda)


def count_events(events: list, cuda: bool) -> dict:
    """Kernels, launches and synchronisations among a profile's events (``COUNTED`` says which)."""
    from torch.autograd import DeviceType

    spans = [e for e in events if e.name == MEASURED and e.device_type == DeviceType.CPU]
    start, end = (spans[0].time_range.start, spans[0].time_range.end) if spans else (-math.inf, math.inf)
    inside = [e for e in events if e.device_type == DeviceType.CPU and start <= e.time_range.start <= end]
    device = [e for e in events if e.device_type != DeviceType.CPU and e.name != MEASURED]
    out: dict = {"aten": dict(Counter(e.name for e in inside if e.name in ATEN_SYNCS))}
    if cuda:
        copies = [e for e in device if e.name.startswith("Memcpy")]
        out["kernels"] = sum(1 for e in device if not e.name.startswith(("Memcpy", "Memset")))
        out["memcpy"] = len(copies)
        out["dtoh"] = sum(1 for e in copies if "DtoH" in e.name)
        # CUDA runtime and driver calls, named without a version suffix (cuMemcpyDtoH_v2 -> cuMemcpyDtoH)
        api = Counter(re.sub(r"_v\d+$", "", e.name) for e in inside if re.match(r"cu(da)?[A-Z]", e.name))
        out["launches"] = sum(n for name, n in api.items() if name in LAUNCH_CALLS)
        out["sync_calls"] = {name: n for name, n in api.items() if name in SYNC_CALLS}
        out["host_syncs"] = sum(out["sync_calls"].values())
        out["runtime_calls"] = dict(api)  # everything, so that a name counted wrongly shows
    return out


def sync_debug_warnings(step: Callable[[], None], timer: Timer) -> int | None:
    """Warnings of torch.cuda.set_sync_debug_mode("warn") during one call + backward (None on CPU)."""
    if not timer.cuda:
        return None
    timer.sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    timer.sync()
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def counted_syncs(fn: Callable[[], object]) -> tuple[object, list[str]]:
    """``fn()`` and the lines of ``host_syncs()`` during it, paths relative to the checkout."""
    from rlstab.testing.syncs import host_syncs

    with host_syncs() as found:
        result = fn()
    return result, [line.replace(f"{ROOT}{os.sep}", "") for line in found]


def profile_section(rep: Report, device, timer: Timer, args) -> None:
    """Section 5: kernels, launches and host syncs of each loss call + backward at ``--profile-tokens``; the targets."""
    tokens = args.profile_tokens
    log(f"section 4: kernels and host syncs per loss call + backward at {fmt_tokens(tokens)} tokens")
    sec = rep.data["profile"] = {
        "tokens": tokens,
        "counted": COUNTED,
        "paths": {},
        "host_syncs": "rlstab.testing.syncs.host_syncs(): operations that would synchronise, "
        "counted on any device, in the call and in its backward apart",
    }
    calls = loss_calls(tokens, device, args)
    lp = calls.pop("_leaf")
    for name in ["hand-written", "stapo frozen", "stapo whole", "grpo frozen", "stare frozen"]:
        fn = calls[name]
        entry = sec["paths"][name] = {}
        try:
            for _ in range(2):  # warm: kernels compiled, caches filled
                lp.grad = None
                fn().backward()
            lp.grad = None
            entry.update(profile_counts(lambda fn=fn: fn().backward(), timer))
            lp.grad = None
            entry["sync_debug_warnings"] = sync_debug_warnings(lambda fn=fn: fn().backward(), timer)
            lp.grad = None
            loss, found = counted_syncs(fn)
            _, found_back = counted_syncs(loss.backward)
            entry["host_syncs_call"], entry["host_syncs_backward"] = len(found), len(found_back)
            entry["host_syncs_list"] = found[:20]
            entry["status"] = "ok"
        except Exception as exc:  # noqa: BLE001
            entry["status"] = failure(exc)
            traceback.print_exc()
        rep.save()
    del calls, lp
    free()
    print(
        f"\nPer loss call + backward at {fmt_tokens(tokens)} tokens{f' ({DRY_NOTE})' if args.dry else ''}:\n"
    )
    print(
        "| loss | kernels | launches | host syncs (runtime) | _local_scalar_dense | DtoH copies | sync-debug warnings "
        "| host_syncs() call | host_syncs() backward | before: kernels, syncs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, e in sec["paths"].items():
        before = BEFORE["profile"].get(name)
        print(
            f"| {name} | {cell(e.get('kernels'))} | {cell(e.get('launches'))} | {cell(e.get('host_syncs'))} "
            f"| {e.get('aten', {}).get('aten::_local_scalar_dense', 0) if 'aten' in e else ''} | {cell(e.get('dtoh'))} "
            f"| {cell(e.get('sync_debug_warnings'))} | {cell(e.get('host_syncs_call'))} | {cell(e.get('host_syncs_backward'))} "
            f"| {'{}, {}'.format(before['kernels'], before['syncs']) if before else ''} |"
        )
        if e.get("status") != "ok":
            print(f"  {name}: {e.get('status')}")
    print(f"\ncounted: {COUNTED}\n", flush=True)
    for name in ("stapo frozen", "grpo frozen", "stare frozen"):
        e = sec["paths"].get(name, {})
        where = f"{name}, {fmt_tokens(tokens)} tokens"
        if "host_syncs_call" in e:
            n = e["host_syncs_call"] + e["host_syncs_backward"]
            rep.target(
                "0 host syncs in a frozen-step call + backward (host_syncs())",
                n,
                0,
                n == 0,
                where,
                False,
                args.dry,
            )
        if e.get("host_syncs") is not None:
            n = e["host_syncs"]
            rep.target(
                "0 host syncs in a frozen-step call + backward (profiler)",
                n,
                0,
                n == 0,
                where,
                False,
                args.dry,
            )


def presets_section(rep: Report, device, args) -> None:
    """Section 5, continued: host_syncs() of every preset's frozen-step call, its backward, and its whole-step call."""
    from rlstab.testing.batches import make_batch as kit_batch
    from rlstab.testing.batches import on_device

    B, T = (16, 64) if args.dry else (64, 1024)
    log(
        f"section 4: host syncs of every preset's call, B x T = {B} x {T} (rlstab.testing.batches.make_batch)"
    )
    sec = rep.data["presets"] = {
        "B": B,
        "T": T,
        "counted": "host_syncs() entries: frozen-step call, its backward, "
        "whole-step call (the micro-batch its own step)",
        "presets": {},
    }
    for name in rlstab.preset_names():
        entry = sec["presets"][name] = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss_fn = rlstab.load(name).compile()
                batch = kit_batch(loss_fn, seed=0, B=B, T=T)
                stats = loss_fn.gather([on_device(batch, device)])
                loss_fn(on_device(batch, device), step=stats).loss.backward()  # warm
                frozen, whole = on_device(batch, device), on_device(batch, device)
                out, found = counted_syncs(partial(loss_fn, frozen, step=stats))
                _, found_back = counted_syncs(out.loss.backward)
                _, found_whole = counted_syncs(partial(loss_fn, whole))
            entry.update(
                frozen_call=len(found),
                frozen_backward=len(found_back),
                whole_call=len(found_whole),
                frozen_list=found[:10],
                whole_list=found_whole[:40],
                status="ok",
            )
        except Exception as exc:  # noqa: BLE001
            entry["status"] = failure(exc)
    rep.save()
    print(f"\nHost syncs per call, every preset (rlstab.testing.syncs.host_syncs(), B x T = {B} x {T}):\n")
    print("| preset | frozen-step call | its backward | whole-step call | first in the frozen-step call |")
    print("|---|---|---|---|---|")
    for name, e in sec["presets"].items():
        if e["status"] != "ok":
            print(f"| {name} | | | | {e['status']} |")
            continue
        first = e["frozen_list"][0].replace("|", "/") if e["frozen_list"] else ""
        print(f"| {name} | {e['frozen_call']} | {e['frozen_backward']} | {e['whole_call']} | {first} |")
    print(flush=True)
