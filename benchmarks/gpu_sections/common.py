"""What the sections of ``benchmarks/gpu.py`` share that needs only the standard library.

The checkout's folders, the requirements checked before anything imports torch, the log line
(seconds since the command started), sizes written ``16k`` or ``4M``, and the numbers of the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
HERE = ROOT / "benchmarks"  # the command, and loss_overhead.py that the loss section imports

# What rlstab needs besides the standard library: module -> requirement.
REQUIRED = {"torch": "torch", "pydantic": "pydantic>=2.7", "einops": "einops>=0.7", "yaml": "pyyaml>=6"}

GIB = 1 << 30
SLICE = 256  # tokens whose results are compared with float64
DRY_NOTE = "dry run: CPU, the GPU's code paths, no timing claims"
START = time.perf_counter()  # when the command started: this module is the first it imports


def missing_packages() -> list[str]:
    """The requirements of rlstab (and of the command) that this Python cannot import."""
    missing = []
    for module, requirement in REQUIRED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(requirement)
    if "pydantic>=2.7" not in missing:
        with contextlib.suppress(Exception):
            version = importlib.metadata.version("pydantic")
            if int(version.split(".")[0]) < 2:
                missing.append(f"pydantic>=2.7 (found {version})")
    return missing


def triton_installed() -> bool:
    """Whether Triton is installed here (found, not imported: importing it reads ``TRITON_INTERPRET``)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def log(message: str) -> None:
    """One progress line, prefixed with the seconds since the command started."""
    print(f"[{time.perf_counter() - START:6.1f} s] {message}", flush=True)


def parse_size(s: str) -> int:
    """``16384``, ``16k``, ``4M`` (k = 1024, M = 1024^2)."""
    mult = {"k": 1 << 10, "m": 1 << 20}.get(s[-1].lower(), 1)
    try:
        return int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (e.g. 16384, 16k, 4M)") from None


def fmt_tokens(n: int) -> str:
    """A number of tokens as the tables write it: ``4M``, ``8k``, else with thousands separators."""
    for unit, size in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


def gb(nbytes: float) -> float:
    """Bytes in GB (10^9: bandwidths are given in GB/s)."""
    return nbytes / 1e9


def rnd(x, digits: int = 4):
    """A number for the tables: ``digits`` significant figures; None and strings stay as they are."""
    if x is None or isinstance(x, str):
        return x
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))


def cell(x, unit: str = "") -> str:
    """A table cell: three significant figures, large and tiny numbers in exponent form; None is empty."""
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e4 or (0 < abs(x) < 1e-3):
        return f"{x:.2e}{unit}"
    return f"{rnd(x, 3):g}{unit}"
