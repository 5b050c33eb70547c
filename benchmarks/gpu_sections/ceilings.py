"""Section 1 of ``benchmarks/gpu.py``: the card, the software, and the ceilings measured there.

bf16 and float32 matmul TFLOP/s (``torch.mm`` of 8192^3, best of a few; float32 with TF32 off), copy
bandwidth (``y.copy_(x)`` of 2 GiB: bytes read + bytes written per second) and read bandwidth (the
best of ``x.amax()`` and ``x.sum()`` over 2 GiB: bytes read per second).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

import torch

import rlstab
from gpu_sections.before import BEFORE
from gpu_sections.common import DRY_NOTE, GIB, ROOT, cell, gb
from gpu_sections.measure import Timer, free


def system_info(device) -> dict:
    """The card and the software: versions, the device, the date, the checkout's commit."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "rlstab": getattr(rlstab, "__version__", None),
        "rlstab_commit": _git("rev-parse", "--short", "HEAD"),
        "rlstab_uncommitted_files": _uncommitted(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001 - any failure means no Triton here
        info["triton"] = f"not importable ({type(exc).__name__}: {exc})"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device_name=props.name,
            capability=".".join(map(str, torch.cuda.get_device_capability(device))),
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / GIB, 1),
        )
        smi = _run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                "--format=csv,noheader",
            ]
        )
        if smi:
            info["nvidia_smi"] = smi.splitlines()[0]
    else:
        info["device_name"] = (
            f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        )
    return info


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _git(*argv: str) -> str | None:
    return _run(["git", *argv]) if (ROOT / ".git").exists() else None


def _uncommitted() -> int | None:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else len(status.splitlines())


def ceilings(device, timer: Timer, dry: bool) -> dict:
    """Section 1: bf16 and float32 matmul TFLOP/s, copy and read bandwidth (``definitions`` says how each is measured)."""
    n = 256 if dry else 8192
    reps = 2 if dry else 5
    out: dict = {"matmul_n": n}

    def best_ms(fn, warm: int = 2) -> float:
        for _ in range(warm):
            fn()
        reads = [timer(fn) for _ in range(reps)]
        timer.sync()
        return min(read() for read in reads)

    g = torch.Generator(device=device).manual_seed(0)
    for key, dtype in (("bf16_matmul_tflops", torch.bfloat16), ("fp32_matmul_tflops", torch.float32)):
        a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # float32: no TF32
        try:
            ms = best_ms(lambda a=a, b=b: torch.mm(a, b))
        finally:
            torch.set_float32_matmul_precision(previous)
        out[key] = 2 * n**3 / (ms * 1e-3) / 1e12
        del a, b
    nbytes = (64 << 20) if dry else 2 * GIB
    out.update(bandwidths(device, g, nbytes, best_ms))
    out["read_gbps"] = max(out["read_gbps_amax"], out["read_gbps_sum"])
    out["definitions"] = (
        "matmul: 2 n^3 / time of torch.mm(n x n, n x n), best of a few (float32 with TF32 off); "
        "copy: (bytes read + bytes written) / time of y.copy_(x); read: bytes read / time of the faster of x.amax() and x.sum()"
    )
    free()
    return out


def bandwidths(device, g, nbytes: int, best_ms) -> dict:
    """Copy (bytes read + written) and read bandwidth over ``nbytes`` of float32, in GB/s."""
    x = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_(generator=g)
    y = torch.empty_like(x)
    return {
        "bandwidth_bytes": nbytes,
        "copy_gbps": gb(2 * nbytes) / (best_ms(lambda: y.copy_(x)) * 1e-3),
        "read_gbps_amax": gb(nbytes) / (best_ms(lambda: torch.amax(x)) * 1e-3),
        "read_gbps_sum": gb(nbytes) / (best_ms(lambda: x.sum()) * 1e-3),
    }


def print_ceilings(ceil: dict, dry: bool) -> None:
    """One line: the four ceilings, and the issue's "before" figures beside them (not in a dry run)."""
    print(
        f"\nbf16 matmul {cell(ceil['bf16_matmul_tflops'])} TFLOP/s, fp32 matmul (no TF32) {cell(ceil['fp32_matmul_tflops'])} "
        f"TFLOP/s, copy {cell(ceil['copy_gbps'])} GB/s (read + write), read {cell(ceil['read_gbps'])} GB/s"
        + (f" ({DRY_NOTE})" if dry else f"; before: 780, 51, 2980 on {BEFORE['where']}")
        + "\n",
        flush=True,
    )
