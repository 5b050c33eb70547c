"""One command on a lent GPU: the card's ceilings, token statistics from logits, the compiled loss, kernels and syncs.

    python benchmarks/gpu.py                 # everything; sized for under 5 minutes on one H100 or H200
    python benchmarks/gpu.py --quick         # fewer repeats, the loss at 4M tokens only, no torch.compile
    python benchmarks/gpu.py --dry           # every path on tiny CPU tensors (CI), no timing claims
    python benchmarks/gpu.py --sections logits --tokens 8k --vocab 64k

It runs from a checkout without installing anything (the checkout goes first on ``sys.path``) and
needs torch, pydantic, einops and pyyaml (it says which are missing); Triton, veRL and Liger-Kernel
are used where they import. It prints markdown tables and writes everything as JSON (``--out``;
default ``$OUT/gpu.json`` when ``OUT`` is set, else ``gpu.json`` here), rewritten after each section
so that a run cut short still leaves what it measured.

1. **The card and its ceilings**: torch, Triton, CUDA, the device, the date; bf16 and float32
   matmul TFLOP/s (``torch.mm`` of 8192^3, best of a few; float32 with TF32 off), copy bandwidth
   (``y.copy_(x)`` of 2 GiB: bytes read + bytes written per second) and read bandwidth (the best of
   ``x.amax()`` and ``x.sum()`` over 2 GiB: bytes read per second).
2. **Token statistics from logits** at N x V (16,384 x 151,936, Qwen3's vocabulary), medians over
   interleaved repeats. Rows: the entropy alone with the logits requiring grad and no backward (what
   the "before" measurement of the issue timed: veRL computes it in the autograd graph), log-prob and
   entropy under ``torch.no_grad`` (old and reference log-probs), each in float32 and bf16; in bf16,
   forward + backward of ``sum(g * entropy)`` (an entropy bonus) and of ``sum(g * logprob)`` with the
   entropy computed but unused by the loss (a policy-gradient backward). Paths: rlstab's
   ``token_stats_from_logits`` (Triton kernels on CUDA), on CUDA also rlstab's torch path (the same
   call with the Triton route turned off, for the same-card comparison), the trainer's own way
   (veRL's ``entropy_from_logits`` and ``logprobs_from_logits`` when ``import verl`` works, else the
   same formulas written here, in the autograd graph), Liger-Kernel's ``liger_cross_entropy`` (the
   log-prob alone; its kernel writes the gradient into its input, so every call gets a fresh copy of
   the logits, made outside the timing), and the floor: one read of the logits at the measured read
   bandwidth without gradient, one read plus one write of the gradient at the copy bandwidth with
   it. Per path: peak extra memory (``max_memory_allocated`` after a reset, minus what was allocated
   before the call: the inputs), memory held after the call (what its outputs keep alive), and the
   largest error of the log-prob, the entropy and the gradient on the first 256 tokens against
   float64. Then the issue's targets, pass or fail.
3. **Token statistics from the LM head** (``rlstab.stats.token_stats``), N = 4,096 and 16,384 tokens,
   H = 4,096, V = 151,936, bf16, forward + backward of ``sum(g * logprob)`` to the hidden states and
   the head, with every token carrying a gradient and with 20% of them: rlstab (Triton row kernels),
   rlstab with torch's row passes, the naive path, veRL's ``linear_cross_entropy`` and Liger-Kernel's
   fused linear cross entropy where they import, and the floor of three matmuls at the measured
   bf16 rate; time, peak extra memory, error against float64 on the first 256 tokens; the targets.
4. **The compiled loss**, B x 1024 tokens (1M, 4M, 16M), forward + backward, medians over
   interleaved repeats: the hand-written eager PPO-clip of ``benchmarks/loss_overhead.py`` (and, at
   the profiled size, the same function under ``torch.compile``); ``stapo`` as its own step
   (``loss_fn(batch)``); ``stapo``, ``grpo`` from rewards (groups of 8) and ``stare`` in a frozen step
   (``stats = loss_fn.gather([batch])`` beforehand, ``loss_fn(batch, step=stats)``); the floor, 17
   bytes per token at the copy bandwidth (log-probs, old log-probs, entropy and the gradient in
   float32, the mask in bytes).
5. **Kernels and host synchronisations per loss call + backward** at 4M tokens, from
   ``torch.profiler`` (what is counted is printed), from ``torch.cuda.set_sync_debug_mode("warn")``,
   and from ``rlstab.testing.syncs.host_syncs()``; then every preset's frozen-step and whole-step call
   under ``host_syncs()``.

Timing: CUDA events on CUDA, with the queue drained before each call, so that a call's time
includes the launches and syncs of its host code; ``time.perf_counter`` on CPU. ``--dry`` runs
every path on tiny CPU tensors, the Triton kernels under Triton's interpreter, and judges only the
targets that are not timings (errors, syncs).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"

# What rlstab needs besides the standard library: module -> requirement.
REQUIRED = {"torch": "torch", "pydantic": "pydantic>=2.7", "einops": "einops>=0.7", "yaml": "pyyaml>=6"}

# Imported in main() once the dependencies are checked (and TRITON_INTERPRET is set for --dry).
torch = None
rlstab = None

GIB = 1 << 30
SLICE = 256  # tokens whose results are compared with float64
GROUP = 8  # responses per prompt for the GRPO rows
EPS_LOW, EPS_HIGH = 0.2, 0.28  # the hand-written loss's clip range, as in benchmarks/loss_overhead.py
LOSS_BYTES_PER_TOKEN = 17  # logprobs 4 + old 4 + mask 1 + entropy 4 + gradient 4
START = time.perf_counter()
DRY_NOTE = "dry run: CPU, the GPU's code paths, no timing claims"

# The "before" state: one NVIDIA H100 80GB HBM3, torch 2.11+cu130, rlstab b3a5381, 2026-11.
BEFORE = {
    "where": "NVIDIA H100 80GB HBM3, torch 2.11+cu130, rlstab b3a5381, 2026-11",
    "ceilings": {"bf16_matmul_tflops": 780, "fp32_matmul_tflops": 51, "copy_gbps": 2980},
    "logits": {  # row -> path -> ms (and GiB held)
        "bf16 entropy, in graph": {
            "rlstab": 130,
            "trainer": 26.2,
            "floor": 1.7,
            "trainer_held_gib": 9.3,
            "rlstab_held_gib": 0.03,
        },
        "fp32 entropy, in graph": {
            "rlstab": 112,
            "trainer": 47.5,
            "floor": 3.3,
            "trainer_held_gib": 18.5,
            "rlstab_held_gib": 0.03,
        },
        "bf16 entropy grad": {"rlstab": 217, "trainer": 75.7},
    },
    "loss": {  # tokens -> path -> ms
        1 << 20: {
            "hand-written": 0.48,
            "stapo whole": 2.64,
            "stapo frozen": 1.32,
            "grpo frozen": 2.22,
            "stare frozen": 1.80,
            "floor": 0.006,
        },
        4 << 20: {
            "hand-written": 0.56,
            "stapo whole": 3.31,
            "stapo frozen": 1.34,
            "grpo frozen": 2.33,
            "stare frozen": 1.81,
            "floor": 0.024,
            "hand-written, torch.compile": 0.64,
        },
        16 << 20: {
            "hand-written": 1.82,
            "stapo whole": 7.62,
            "stapo frozen": 2.85,
            "grpo frozen": 4.11,
            "stare frozen": 3.60,
            "floor": 0.096,
        },
    },
    "profile": {
        "hand-written": {"kernels": 37, "syncs": 2},
        "stapo frozen": {"kernels": 89, "syncs": 5},
        "stapo whole": {"kernels": 173, "syncs": 51},
    },
}


# ----------------------------------------------------------------------------- start-up


def missing_packages() -> list[str]:
    """The requirements of rlstab (and of this script) that this Python cannot import."""
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


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f} s] {message}", flush=True)


def parse_size(s: str) -> int:
    """``16384``, ``16k``, ``4M`` (k = 1024, M = 1024^2)."""
    mult = {"k": 1 << 10, "m": 1 << 20}.get(s[-1].lower(), 1)
    try:
        return int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (e.g. 16384, 16k, 4M)") from None


def fmt_tokens(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


SECTIONS = ("ceilings", "logits", "head", "loss", "profile", "presets")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--dry", action="store_true", help="tiny CPU tensors, Triton's interpreter, no timing claims (CI)"
    )
    p.add_argument(
        "--quick", action="store_true", help="fewer repeats, the loss at 4M tokens only, no torch.compile"
    )
    p.add_argument(
        "--out", default=None, help="JSON file (default: $OUT/gpu.json when OUT is set, else gpu.json)"
    )
    p.add_argument(
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to run (default: all)"
    )
    p.add_argument(
        "--tokens", type=parse_size, default=None, help="N of the logits table (default 16384; --dry 64)"
    )
    p.add_argument(
        "--vocab", type=parse_size, default=None, help="V of the logits table (default 151936; --dry 1000)"
    )
    p.add_argument(
        "--loss-tokens",
        nargs="+",
        type=parse_size,
        default=None,
        help="loss sizes (default 1M 4M 16M; --dry 4k 8k)",
    )
    p.add_argument(
        "--profile-tokens",
        type=parse_size,
        default=None,
        help="size of the kernel and sync counts and of the loss targets (default 4M; --dry the largest loss size)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed repeats of the logits table (default 10; --quick 5; --dry 2)",
    )
    p.add_argument(
        "--loss-repeats",
        type=int,
        default=None,
        help="timed repeats of the loss table (default 25; --quick 10; --dry 2)",
    )
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed calls of each path first (default 2; --dry 1)"
    )
    p.add_argument(
        "--no-verl", action="store_true", help="the trainer's formulas written here even where veRL imports"
    )
    p.add_argument("--no-liger", action="store_true", help="leave Liger-Kernel out")
    p.add_argument(
        "--head-tokens", nargs="+", type=parse_size, default=None,
        help="N of the LM-head table (default 4096 16384; --quick 4096; --dry 64)",
    )
    p.add_argument("--hidden", type=parse_size, default=None, help="H of the LM-head table (default 4096; --dry 32)")
    p.add_argument(
        "--no-compile", action="store_true", help="leave out the torch.compile'd hand-written loss"
    )
    args = p.parse_args(argv)
    dry, quick = args.dry, args.quick
    args.tokens = args.tokens or (64 if dry else 16384)
    args.vocab = args.vocab or (1000 if dry else 151936)
    args.loss_tokens = args.loss_tokens or (
        [4 << 10, 8 << 10] if dry else [4 << 20] if quick else [1 << 20, 4 << 20, 16 << 20]
    )
    args.profile_tokens = args.profile_tokens or (max(args.loss_tokens) if dry else 4 << 20)
    args.head_tokens = args.head_tokens or ([64] if dry else [4096] if quick else [4096, 16384])
    args.hidden = args.hidden or (32 if dry else 4096)
    args.repeats = args.repeats or (2 if dry else 5 if quick else 10)
    args.loss_repeats = args.loss_repeats or (2 if dry else 10 if quick else 25)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 2)
    args.no_compile = args.no_compile or quick  # a cold torch.compile can take half a minute
    if args.out is None:
        args.out = str(Path(os.environ["OUT"]) / "gpu.json") if os.environ.get("OUT") else "gpu.json"
    return args


# ----------------------------------------------------------------------------- measuring


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
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def failure(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"failed: {type(exc).__name__}: {first}"


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


def gb(nbytes: float) -> float:
    return nbytes / 1e9


def rnd(x, digits: int = 4):
    """A number for the tables: ``digits`` significant figures; None stays None."""
    if x is None or isinstance(x, str):
        return x
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))


def cell(x, unit: str = "") -> str:
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e4 or (0 < abs(x) < 1e-3):
        return f"{x:.2e}{unit}"
    return f"{rnd(x, 3):g}{unit}"


class Report:
    """Everything measured, written as JSON after each section."""

    def __init__(self, args) -> None:
        self.path = Path(args.out)
        self.data: dict = {
            "dry": args.dry,
            "timing_note": DRY_NOTE if args.dry else "CUDA events, medians of interleaved repeats",
            "arguments": {k: v for k, v in vars(args).items() if k != "out"},
            "before": _json_before(),
            "targets": [],
            "sections_s": {},
        }

    def target(self, name: str, value, limit, ok: bool | None, where: str, timing: bool, dry: bool) -> None:
        judged = None if (timing and dry) else ok
        self.data["targets"].append(
            {"target": name, "where": where, "value": value, "limit": limit, "pass": judged, "timing": timing}
        )

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(_finite(self.data), indent=1)
        self.path.write_text(text + "\n")


def _json_before() -> dict:
    out = dict(BEFORE)
    out["loss"] = {str(k): v for k, v in BEFORE["loss"].items()}
    return out


def _finite(x):
    """JSON without NaN or infinities: those become the strings "nan", "inf", "-inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


# ----------------------------------------------------------------------------- 1. the card


def system_info(device) -> dict:
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
    x = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_(generator=g)
    y = torch.empty_like(x)
    return {
        "bandwidth_bytes": nbytes,
        "copy_gbps": gb(2 * nbytes) / (best_ms(lambda: y.copy_(x)) * 1e-3),
        "read_gbps_amax": gb(nbytes) / (best_ms(lambda: torch.amax(x)) * 1e-3),
        "read_gbps_sum": gb(nbytes) / (best_ms(lambda: x.sum()) * 1e-3),
    }


# ----------------------------------------------------------------------------- 2. token statistics


ROWS = [  # name, dtype, mode; the float32 rows first, so that their logits are freed before bf16's
    ("fp32 entropy, in graph", "float32", "entropy_in_graph"),
    ("fp32 no grad", "float32", "no_grad"),
    ("bf16 entropy, in graph", "bfloat16", "entropy_in_graph"),
    ("bf16 no grad", "bfloat16", "no_grad"),
    ("bf16 entropy grad", "bfloat16", "entropy_grad"),
    ("bf16 log-prob grad", "bfloat16", "logprob_grad"),
]
MODES = {
    "entropy_in_graph": "the entropy alone, logits requiring grad, no backward (the issue's 'before' measurement)",
    "no_grad": "log-prob and entropy under torch.no_grad",
    "entropy_grad": "forward + backward of sum(g * entropy) (entropy bonus)",
    "logprob_grad": "log-prob and entropy, forward + backward of sum(g * logprob) (entropy unused by the loss)",
}
GRAD_MODES = ("entropy_grad", "logprob_grad")


class LogitPath:
    """One way to get (log-prob, entropy) from logits. ``stats(x, labels, entropy_grad)``."""

    def __init__(
        self,
        name: str,
        describe: str,
        stats=None,
        status: str = "ok",
        fresh_input: bool = False,
        modes=tuple(MODES),
        context=contextlib.nullcontext,
    ) -> None:
        self.name, self.describe, self.stats, self.status = name, describe, stats, status
        self.fresh_input, self.modes, self.context = fresh_input, modes, context


def formula_entropy(logits):
    """The entropy as trainers write it, in the autograd graph: logsumexp - sum(softmax * logits)."""
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(-1)


def formula_logprob(logits, labels):
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def trainer_path(no_verl: bool) -> LogitPath:
    reason = "--no-verl"
    if not no_verl:
        try:
            import verl
            from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

            kwargs = {}
            if "inplace_backward" in inspect.signature(logprobs_from_logits).parameters:
                # veRL's actor passes False when it computes the entropy too (as here); True would
                # write the gradient into the logits that every path shares.
                kwargs["inplace_backward"] = False

            def verl_stats(x, labels, entropy_grad):
                lp = None if labels is None else logprobs_from_logits(x, labels, **kwargs)
                return lp, entropy_from_logits(x)

            return LogitPath(
                "trainer",
                f"veRL {getattr(verl, '__version__', '?')}: entropy_from_logits, "
                f"logprobs_from_logits({', '.join(f'{k}={v}' for k, v in kwargs.items())})",
                verl_stats,
            )
        except Exception as exc:  # noqa: BLE001 - any failure means "no verl"
            reason = f"veRL not importable: {type(exc).__name__}: {str(exc)[:120]}"

    def formula_stats(x, labels, entropy_grad):
        return (None if labels is None else formula_logprob(x, labels)), formula_entropy(x)

    return LogitPath(
        "trainer",
        f"the trainers' formulas written here, in graph ({reason}): logsumexp - "
        "sum(softmax * logits); log_softmax + gather",
        formula_stats,
    )


def liger_path(device, no_liger: bool) -> LogitPath:
    describe = "Liger-Kernel liger_cross_entropy(reduction='none'): the log-prob alone, a fresh copy of the logits per call"
    if no_liger:
        return LogitPath("liger", describe, status="skipped: --no-liger")
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception as exc:  # noqa: BLE001
        return LogitPath("liger", describe, status=f"unavailable ({type(exc).__name__}: {str(exc)[:120]})")
    if device.type != "cuda":
        return LogitPath("liger", describe, status="skipped: its kernels need CUDA")

    def liger_stats(x, labels, entropy_grad):
        return -liger_cross_entropy(x, labels, reduction="none"), None

    return LogitPath("liger", describe, liger_stats, fresh_input=True, modes=("no_grad", "logprob_grad"))


def triton_entry():
    """``rlstab.stats.triton.token_stats_from_logits_triton``, or the reason it is not there."""
    try:
        module = importlib.import_module("rlstab.stats.triton")
        return module.token_stats_from_logits_triton, "ok"
    except Exception as exc:  # noqa: BLE001 - not written yet, no Triton, a broken kernel: all "unavailable"
        return None, f"unavailable ({type(exc).__name__}: {str(exc)[:160]})"


@contextlib.contextmanager
def torch_route():
    """rlstab's torch path on CUDA: the public call with its Triton route turned off, for the same-card comparison."""
    from rlstab.stats import from_logits

    original = from_logits._use_triton
    from_logits._use_triton = lambda logits: False
    try:
        yield
    finally:
        from_logits._use_triton = original


def logit_paths(device, args) -> tuple[list[LogitPath], str]:
    from rlstab.stats import token_stats_from_logits

    def public(x, labels, entropy_grad):
        return token_stats_from_logits(x, labels, entropy_grad=entropy_grad)

    entry, status = triton_entry()
    paths = [
        LogitPath(
            "rlstab",
            "rlstab.stats.token_stats_from_logits"
            + (" (Triton on CUDA)" if device.type == "cuda" else " (the CPU reference path)"),
            public,
        )
    ]
    if device.type == "cuda":
        from rlstab.stats import from_logits

        ok = hasattr(from_logits, "_use_triton")
        paths.append(
            LogitPath(
                "rlstab torch path",
                "the same call with the Triton route turned off (GPU-sized chunks)",
                public if ok else None,
                "ok" if ok else "unavailable (no Triton route to turn off)",
                context=torch_route,
            )
        )
    else:
        paths.append(
            LogitPath(
                "rlstab triton",
                "rlstab.stats.triton.token_stats_from_logits_triton under Triton's interpreter",
                (lambda x, labels, entropy_grad: entry(x, labels, entropy_grad=entropy_grad))
                if entry
                else None,
                status if entry else f"triton path: {status}",
            )
        )
    paths += [trainer_path(args.no_verl), liger_path(device, args.no_liger)]
    return paths, status


def make_logits(n: int, vocab: int, dtype, device, seed: int = 0):
    """Logits of a few units (a trained LM head's scale), labels, and an upstream gradient per token."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, vocab, device=device, generator=g).mul_(3.0).to(getattr(torch, dtype))
    labels = torch.randint(0, vocab, (n,), device=device, generator=g)
    grad = torch.randn(n, device=device, generator=g)
    return x, labels, grad


def execute(path: LogitPath, x, labels, g, mode: str):
    """One call of a path in a row's mode (forward, and backward in the gradient modes)."""
    with path.context():
        if mode == "no_grad":
            with torch.no_grad():
                return path.stats(x, labels, False)
        if mode == "entropy_in_graph":
            return path.stats(x, None, False)
        if mode == "entropy_grad":
            lp, ent = path.stats(x, None, True)
            (ent * g).sum().backward()
            return lp, ent
        lp, ent = path.stats(x, labels, False)
        (lp * g).sum().backward()
        return lp, ent


def reference(x, labels, g, mode: str):
    """float64 log-prob, entropy and (in the gradient modes) gradient of the first tokens."""
    z = x[:SLICE].detach().double().requires_grad_(mode in GRAD_MODES)
    with torch.enable_grad():
        lse = torch.logsumexp(z, -1)
        ent = lse - (torch.softmax(z, -1) * z).sum(-1)
        lp = z.gather(-1, labels[:SLICE, None]).squeeze(-1) - lse
        if mode == "entropy_grad":
            (ent * g[:SLICE].double()).sum().backward()
        elif mode == "logprob_grad":
            (lp * g[:SLICE].double()).sum().backward()
    return lp.detach(), ent.detach(), z.grad


def max_error(value, ref):
    if value is None or ref is None:
        return None
    return float((value.detach()[:SLICE].double() - ref).abs().max())


def logits_row(row, x, labels, g, paths, timer, ceil, args, device) -> dict:
    name, dtype, mode = row
    n, vocab = x.shape
    x.requires_grad_(mode != "no_grad")
    nbytes = x.numel() * x.element_size()
    if mode in GRAD_MODES:
        floor = gb(2 * nbytes) / ceil["copy_gbps"] * 1e3
        floor_def = f"one read of the logits and one write of their gradient, 2 x {gb(nbytes):.3g} GB at the copy bandwidth"
    else:
        floor = gb(nbytes) / ceil["read_gbps"] * 1e3
        floor_def = f"one read of the logits, {gb(nbytes):.3g} GB at the read bandwidth"
    ref_lp, ref_ent, ref_grad = reference(x, labels, g, mode)
    pristine = x[:SLICE].detach().clone()
    out: dict = {
        "row": name,
        "dtype": dtype,
        "mode": mode,
        "what": MODES[mode],
        "tokens": n,
        "vocab": vocab,
        "floor_ms": floor,
        "floor": floor_def,
        "paths": {},
    }
    log(f"table 1: {name}, N = {n:,}, V = {vocab:,}: {MODES[mode]}")
    inputs: dict[str, object] = {}
    calls = {}
    for path in paths:
        entry = out["paths"][path.name] = {"what": path.describe}
        if path.stats is None:
            entry["status"] = path.status
            continue
        if mode not in path.modes:
            entry["status"] = "n/a: " + ("no entropy" if path.name == "liger" else "mode not supported")
            continue

        def prepare(path=path):
            x.grad = None
            inputs.clear()  # at most one fresh copy of the logits alive at a time
            if path.fresh_input:
                inputs[path.name] = x.detach().clone().requires_grad_(mode != "no_grad")
            else:
                inputs[path.name] = x

        def call(path=path):
            return execute(path, inputs[path.name], labels, g, mode)

        try:  # first call: compiles kernels; a path that fails is reported and left out
            prepare()
            call()
            timer.sync()
        except Exception as exc:  # noqa: BLE001
            entry["status"] = failure(exc) if not is_oom(exc) else "failed: out of memory"
            continue
        finally:
            inputs.clear()
            x.grad = None
            free()
        entry["status"] = "ok"
        calls[path.name] = (prepare, call)
    for _ in range(args.warmup - 1):
        for prepare, call in calls.values():
            prepare()
            call()
    for pname, ms in interleaved(timer, calls, args.repeats, name).items():
        out["paths"][pname]["ms"] = ms
    for pname, (prepare, call) in calls.items():  # memory and errors: one more call each
        entry = out["paths"][pname]
        prepare()
        inp = inputs[pname]
        timer.sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        lp, ent = call()
        timer.sync()
        if device.type == "cuda":
            entry["peak_extra_gib"] = (torch.cuda.max_memory_allocated(device) - base) / GIB
            entry["held_gib"] = (torch.cuda.memory_allocated(device) - base) / GIB
        entry["logprob_err"] = (
            max_error(lp, ref_lp) if mode not in ("entropy_in_graph", "entropy_grad") else None
        )
        entry["entropy_err"] = max_error(ent, ref_ent)
        if mode in GRAD_MODES:
            entry["grad_err"] = max_error(inp.grad, ref_grad)
            entry["grad_max"] = float(ref_grad.abs().max())
        del lp, ent, inp
        inputs.clear()
        x.grad = None
        if not torch.equal(x[:SLICE].detach(), pristine):
            entry["status"] = "ok, but it changed its input: the logits were made again"
            x.data.copy_(make_logits(n, vocab, dtype, device)[0])
        free()
    paths_ms = {k: v.get("ms") for k, v in out["paths"].items()}
    r, t = paths_ms.get("rlstab"), paths_ms.get("trainer")
    out["ratios"] = {
        "rlstab / trainer": r / t if r and t else None,
        "rlstab / floor": r / floor if r else None,
        "trainer / floor": t / floor if t else None,
        "liger / floor": paths_ms["liger"] / floor if paths_ms.get("liger") else None,
    }
    before = BEFORE["logits"].get(name)
    if before:
        out["before_ms"] = {k: v for k, v in before.items() if not k.endswith("gib")}
    print_row(out, args.dry)
    return out


def print_row(row: dict, dry: bool) -> None:
    note = f" ({DRY_NOTE})" if dry else ""
    print(f"\n{row['row']}: {row['what']}{note}\nfloor {cell(row['floor_ms'])} ms: {row['floor']}\n")
    print(
        "| path | ms | x floor | peak extra GiB | held GiB | log-prob err | entropy err | grad err (max grad) | before ms | status |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    before = row.get("before_ms", {})
    for name, e in row["paths"].items():
        ms = e.get("ms")
        grad = "" if e.get("grad_err") is None else f"{cell(e['grad_err'])} ({cell(e['grad_max'])})"
        print(
            f"| {name} | {cell(ms)} | {cell(ms / row['floor_ms'] if ms else None)} | {cell(e.get('peak_extra_gib'))} "
            f"| {cell(e.get('held_gib'))} | {cell(e.get('logprob_err'))} | {cell(e.get('entropy_err'))} | {grad} "
            f"| {cell(before.get(name))} | {e['status']} |"
        )
    ratios = ", ".join(f"{k} {cell(v)}" for k, v in row["ratios"].items() if v is not None)
    print(f"\n{ratios}" + (f"; before: {BEFORE['where']}" if before else ""), flush=True)


def logits_section(rep: Report, device, timer: Timer, ceil: dict, args) -> None:
    paths, triton_status = logit_paths(device, args)
    sec = rep.data["token_stats"] = {
        "tokens": args.tokens,
        "vocab": args.vocab,
        "repeats": args.repeats,
        "slice_checked": SLICE,
        "triton": "triton path: " + triton_status,
        "paths": {p.name: {"what": p.describe, "status": p.status} for p in paths},
        "memory": "peak extra: max_memory_allocated during the call minus what was allocated before it (the inputs); "
        "held: allocated after the call, outputs alive, minus the same (with gradient: includes the [N, V] gradient)",
        "rows": [],
    }
    if device.type == "cuda":
        from rlstab.stats import from_logits

        route = getattr(from_logits, "_use_triton", None)
        probe = torch.empty(1, 8, device=device, dtype=torch.bfloat16)
        sec["rlstab_route"] = (
            "unknown" if route is None else ("triton" if route(probe) else "torch (Triton did not import)")
        )
        log(f"rlstab's route for CUDA logits: {sec['rlstab_route']}")
    log("triton path: " + triton_status)
    for p in paths:
        log(f"  {p.name}: {p.describe} [{p.status}]")
    for dtype in ("float32", "bfloat16"):
        try:
            x, labels, g = make_logits(args.tokens, args.vocab, dtype, device)
        except Exception as exc:  # noqa: BLE001
            log(f"table 1: {dtype} logits: {failure(exc)}")
            continue
        for row in (r for r in ROWS if r[1] == dtype):
            sec["rows"].append(logits_row(row, x, labels, g, paths, timer, ceil, args, device))
            rep.save()
        del x, labels, g
        free()
    logits_targets(rep, sec, args.dry)


def logits_targets(rep: Report, sec: dict, dry: bool) -> None:
    rows = {r["row"]: r for r in sec["rows"]}

    def ms(row, path):
        return rows[row]["paths"].get(path, {}).get("ms") if row in rows else None

    for row in ("bf16 entropy, in graph", "bf16 no grad"):
        if row not in rows:
            continue
        r, t, floor = ms(row, "rlstab"), ms(row, "trainer"), rows[row]["floor_ms"]
        rep.target("bf16 without gradient <= 5 ms", r, 5.0, r is not None and r <= 5.0, row, True, dry)
        rep.target(
            "bf16 without gradient <= 3x the floor",
            r / floor if r else None,
            3.0,
            bool(r) and r <= 3 * floor,
            row,
            True,
            dry,
        )
        rep.target(
            "bf16 without gradient >= 5x faster than the trainer's",
            t / r if r and t else None,
            5.0,
            bool(r and t) and t >= 5 * r,
            row,
            True,
            dry,
        )
    for row in ("fp32 entropy, in graph", "fp32 no grad"):
        if row in rows:
            r = ms(row, "rlstab")
            rep.target("fp32 without gradient <= 8 ms", r, 8.0, r is not None and r <= 8.0, row, True, dry)
    for row in ("bf16 entropy grad", "bf16 log-prob grad"):
        if row in rows:
            r, t = ms(row, "rlstab"), ms(row, "trainer")
            rep.target(
                "with gradient <= 0.5x the trainer's forward + backward",
                r / t if r and t else None,
                0.5,
                bool(r and t) and r <= 0.5 * t,
                row,
                True,
                dry,
            )
    for row in rows.values():
        rl, tr = row["paths"].get("rlstab", {}), row["paths"].get("trainer", {})
        if (
            row["mode"] not in GRAD_MODES
            and rl.get("peak_extra_gib") is not None
            and tr.get("peak_extra_gib")
        ):
            share = rl["peak_extra_gib"] / tr["peak_extra_gib"]
            rep.target(
                "peak memory <= 1% of the trainer's", share, 0.01, share <= 0.01, row["row"], False, dry
            )
        errors = [e for e in (rl.get("logprob_err"), rl.get("entropy_err")) if e is not None]
        if rl.get("status") == "ok":
            worst = max(errors) if errors else None
            rep.target(
                "error against float64 <= 1e-5",
                worst,
                1e-5,
                worst is not None and worst <= 1e-5,
                row["row"],
                False,
                dry,
            )


# ----------------------------------------------------------------------------- 3. the compiled loss


def handwritten_loss(logprobs, old, adv_bt, mask):
    """benchmarks/loss_overhead.py's baseline: eager PPO-clip (0.2 / 0.28), masked token mean."""
    ratio = torch.exp(logprobs - old)
    loss = torch.max(-adv_bt * ratio, -adv_bt * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH))
    return (loss * mask).sum() / mask.sum()


_COMPILED: dict = {}


def loss_calls(tokens: int, device, args, compiled: bool = False) -> dict[str, Callable]:
    """name -> zero-argument callable returning the loss of one call; ``lp`` (the leaf) under key "_leaf"."""
    from loss_overhead import make_batch, token_batch

    d = {k: v.to(device) for k, v in make_batch(tokens).items()}
    d["advantages_bt"] = d["advantages"].unsqueeze(-1).expand_as(d["logprobs"]).contiguous()
    B = d["logprobs"].shape[0]
    g = torch.Generator().manual_seed(1)
    d["rewards"] = (torch.rand(B, generator=g) < 0.5).float().to(device)  # binary outcome rewards
    d["group_ids"] = (torch.arange(B) // GROUP).to(device)
    lp = d["logprobs"].clone().requires_grad_(True)

    def grpo_batch(logprobs):
        return rlstab.TokenBatch(
            logprobs=logprobs,
            old_logprobs=d["old_logprobs"],
            response_mask=d["response_mask"],
            rewards=d["rewards"],
            group_ids=d["group_ids"],
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stapo, grpo, stare = (rlstab.load(name).compile() for name in ("stapo", "grpo", "stare"))
        stapo_stats = stapo.gather([token_batch(d, d["logprobs"])])
        grpo_stats = grpo.gather([grpo_batch(d["logprobs"])])
        stare_stats = stare.gather([token_batch(d, d["logprobs"])])
    calls = {
        "hand-written": lambda: handwritten_loss(
            lp, d["old_logprobs"], d["advantages_bt"], d["response_mask"]
        ),
        "stapo whole": lambda: stapo(token_batch(d, lp)).loss,
        "stapo frozen": lambda: stapo(token_batch(d, lp), step=stapo_stats).loss,
        "grpo frozen": lambda: grpo(grpo_batch(lp), step=grpo_stats).loss,
        "stare frozen": lambda: stare(token_batch(d, lp), step=stare_stats).loss,
    }
    if compiled:
        if "fn" not in _COMPILED:
            # On CPU (--dry) dynamo's tracing alone, in seconds; inductor there needs a C++ compiler and minutes.
            backend = "eager" if device.type == "cpu" else "inductor"
            _COMPILED["fn"] = torch.compile(handwritten_loss, backend=backend, fullgraph=True, dynamic=False)
            _COMPILED["backend"] = backend
        fn = _COMPILED["fn"]
        calls["hand-written, torch.compile"] = lambda: fn(
            lp, d["old_logprobs"], d["advantages_bt"], d["response_mask"]
        )
    calls["_leaf"] = lp
    return calls


def loss_steps(calls: dict) -> dict:
    """name -> (prepare, step): ``step`` is the call and its backward."""
    lp = calls["_leaf"]

    def prepare():
        lp.grad = None

    return {name: (prepare, lambda fn=fn: fn().backward()) for name, fn in calls.items() if name != "_leaf"}


LOSS_ORDER = [
    "hand-written",
    "hand-written, torch.compile",
    "stapo whole",
    "stapo frozen",
    "grpo frozen",
    "stare frozen",
]


def loss_section(rep: Report, device, timer: Timer, ceil: dict, args) -> None:
    sec = rep.data["loss"] = {
        "T": 1024,
        "repeats": args.loss_repeats,
        "group_size": GROUP,
        "floor": f"{LOSS_BYTES_PER_TOKEN} bytes per token (logprobs 4 + old 4 + mask 1 + entropy 4 + gradient 4) at the copy bandwidth",
        "rows": [],
    }
    for tokens in args.loss_tokens:
        log(
            f"table 2: the compiled loss at {fmt_tokens(tokens)} tokens (B = {max(tokens // 1024, 1)} x 1024)"
        )
        compiled = tokens == args.profile_tokens and not args.no_compile
        row: dict = {"tokens": tokens, "ms": {}, "status": {}}
        try:
            steps = loss_steps(loss_calls(tokens, device, args, compiled))
        except Exception as exc:  # noqa: BLE001
            row["status"]["all"] = failure(exc)
            sec["rows"].append(row)
            continue
        live = {}
        for name, (prepare, step) in steps.items():
            if name == "hand-written, torch.compile":
                log(f"  torch.compile of the hand-written loss ({_COMPILED.get('backend')})")
            try:
                prepare()
                step()
                timer.sync()
                row["status"][name] = "ok"
                live[name] = (prepare, step)
            except Exception as exc:  # noqa: BLE001
                row["status"][name] = failure(exc)
        if "hand-written, torch.compile" in row["status"]:
            row["compile_backend"] = _COMPILED.get("backend")
        for _ in range(args.warmup - 1):
            for prepare, step in live.values():
                prepare()
                step()
        row["ms"] = interleaved(timer, live, args.loss_repeats, fmt_tokens(tokens))
        row["floor_ms"] = gb(LOSS_BYTES_PER_TOKEN * tokens) / ceil["copy_gbps"] * 1e3
        base = row["ms"].get("hand-written")
        row["ratios"] = {
            f"{k} / hand-written": v / base for k, v in row["ms"].items() if base and k != "hand-written"
        }
        row["ratios"]["hand-written / floor"] = base / row["floor_ms"] if base else None
        row["before_ms"] = BEFORE["loss"].get(tokens)
        sec["rows"].append(row)
        del steps, live
        free()
        rep.save()
    print_loss(sec, args.dry)
    at = next((r for r in sec["rows"] if r["tokens"] == args.profile_tokens), None)
    if at and at["ms"].get("hand-written"):
        where = f"{fmt_tokens(args.profile_tokens)} tokens"
        for name, limit, label in (
            ("stapo frozen", 1.3, "stapo frozen step <= 1.3x the hand-written loss"),
            ("stapo whole", 2.0, "stapo whole step <= 2x the hand-written loss"),
        ):
            ratio = at["ratios"].get(f"{name} / hand-written")
            rep.target(label, ratio, limit, ratio is not None and ratio <= limit, where, True, args.dry)


def print_loss(sec: dict, dry: bool) -> None:
    names = [n for n in LOSS_ORDER if any(n in r["ms"] for r in sec["rows"])]
    print(
        f"\nThe compiled loss, forward + backward, ms (median of {sec['repeats']}){f' ({DRY_NOTE})' if dry else ''}:\n"
    )
    print("| tokens | " + " | ".join(names) + " | floor | frozen / hand-written | whole / hand-written |")
    print("|---|" + "---|" * (len(names) + 3))
    for r in sec["rows"]:
        cells = [cell(r["ms"].get(n)) or r["status"].get(n, r["status"].get("all", "")) for n in names]
        ratios = r.get("ratios", {})
        print(
            f"| {fmt_tokens(r['tokens'])} | " + " | ".join(cells) + f" | {cell(r.get('floor_ms'))} "
            f"| {cell(ratios.get('stapo frozen / hand-written'))} | {cell(ratios.get('stapo whole / hand-written'))} |"
        )
        if r.get("before_ms"):
            print(
                f"| before ({fmt_tokens(r['tokens'])}) | "
                + " | ".join(cell(r["before_ms"].get(n)) for n in names)
                + f" | {cell(r['before_ms'].get('floor'))} | | |"
            )
    print(flush=True)


# ----------------------------------------------------------------------------- 4. kernels and syncs

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
    from rlstab.testing.syncs import host_syncs

    with host_syncs() as found:
        result = fn()
    return result, [line.replace(f"{ROOT}{os.sep}", "") for line in found]


def profile_section(rep: Report, device, timer: Timer, args) -> None:
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


def on_device(batch, device):
    """A copy of a TokenBatch on ``device``, its differentiable fields fresh leaves."""
    from dataclasses import fields

    values = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor):
            v = v.detach().to(device).requires_grad_(v.requires_grad)
        values[f.name] = v
    return rlstab.TokenBatch(**values)


def presets_section(rep: Report, device, args) -> None:
    from rlstab.testing.batches import make_batch as kit_batch

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


# ----------------------------------------------------------------------------- 3. the LM head


def head_paths(device, args) -> dict[str, Callable]:
    """name -> fn(h, W, labels) -> (logprob, entropy or None), each differentiable to h and W."""
    from rlstab.stats import lm_head_gpu, token_stats

    def gpu_path(use_triton):
        def fn(h, w, y):
            return lm_head_gpu.token_stats_gpu(h, w, y, temperature=1.0, entropy_grad=False, ignore_index=-100,
                                               use_triton=use_triton)
        return fn

    def naive(h, w, y):  # what a trainer writes: bf16 logits, float32 log-softmax, entropy without gradient
        logp = torch.log_softmax((h @ w.t()).float(), -1)
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
        return logp.gather(-1, y.unsqueeze(-1)).squeeze(-1), entropy

    paths = {
        # on CUDA the public function routes itself (Triton when it imports); on CPU the GPU path is called
        "rlstab": (lambda h, w, y: token_stats(h, w, y)) if device.type == "cuda" else gpu_path(True),
        "rlstab, torch row passes": gpu_path(False),
        "naive": naive,
    }
    if device.type == "cuda" and not args.no_verl:
        try:
            from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy

            paths["veRL linear_cross_entropy"] = lambda h, w, y: linear_cross_entropy(h, w, y, 1.0, "none", None)
        except Exception as exc:  # noqa: BLE001
            log(f"  veRL linear_cross_entropy: not importable ({failure(exc)})")
    if device.type == "cuda" and not args.no_liger:
        try:
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

            def liger(h, w, y):  # the log-prob alone (minus its per-token cross entropy); no entropy
                out = LigerFusedLinearCrossEntropyFunction.apply(h, w, y, None, None, -100, 0.0, 0.0, "none")
                return (out[0] if isinstance(out, tuple) else out).neg(), None  # (loss, z_loss, ...) in recent versions

            paths["Liger fused linear cross entropy"] = liger
        except Exception as exc:  # noqa: BLE001
            log(f"  Liger-Kernel: not importable ({failure(exc)})")
    return paths


def head_section(rep: Report, device, timer: Timer, ceil: dict, args) -> None:
    """Table 3: token_stats from hidden states and the LM head, forward + backward to both."""
    vocab, hidden_size = args.vocab, args.hidden
    sec = rep.data["head"] = {
        "H": hidden_size, "V": vocab, "dtype": "bf16",
        "what": "forward + backward of sum(g * logprob) to the hidden states and the LM head; entropy detached",
        "floor": "three matmuls of 2 N V H FLOPs at the measured bf16 rate",
        "rows": [],
    }
    paths = head_paths(device, args)
    for n in args.head_tokens:
        for active in (1.0, 0.2):
            sec["rows"].append(head_row(paths, n, active, hidden_size, vocab, device, timer, ceil, args))
            rep.save()
            free()
    print_head(sec, args.dry)
    head_targets(rep, sec, args.dry)


def head_row(paths, n, active, hidden_size, vocab, device, timer: Timer, ceil: dict, args) -> dict:
    """One row of table 3: N tokens, a share ``active`` of them with a nonzero upstream gradient."""
    g = torch.Generator(device="cpu").manual_seed(n)
    h = torch.randn(n, hidden_size, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(vocab, hidden_size, generator=g) * (2.0 / math.sqrt(hidden_size))).to(device, torch.bfloat16)
    y = torch.randint(0, vocab, (n,), generator=g).to(device)
    up = torch.randn(n, generator=g)
    up = torch.where(torch.rand(n, generator=g) < active, up, 0.0).to(device)  # 20%: as under 20-Entropy
    floor = 3 * 2 * n * vocab * hidden_size / (ceil["bf16_matmul_tflops"] * 1e12) * 1e3
    row = {"tokens": n, "active": active, "floor_ms": floor, "paths": {}}
    log(f"table 3: LM head, N = {n:,}, H = {hidden_size:,}, V = {vocab:,}, {active:.0%} of tokens with a gradient")
    logp64 = torch.log_softmax(h[:SLICE].double() @ w.double().t(), -1)  # float64 from the bf16 values
    ref_lp = logp64.gather(-1, y[:SLICE].unsqueeze(-1)).squeeze(-1)
    ref_ent = -(logp64.exp() * logp64).sum(-1)
    del logp64
    leaves: dict = {}
    calls = {}

    def prepare(name):
        leaves[name] = (h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_())

    def call(name):
        hh, ww = leaves[name]
        lp, ent = paths[name](hh, ww, y)
        (lp.float() * up).sum().backward()
        return lp, ent

    for name in paths:
        entry = row["paths"][name] = {}
        try:
            prepare(name)
            lp, ent = call(name)
            timer.sync()
            entry["logprob_err"] = max_error(lp[:SLICE], ref_lp)
            entry["entropy_err"] = None if ent is None else max_error(ent[:SLICE], ref_ent)
            entry["status"] = "ok"
            calls[name] = (partial(prepare, name), partial(call, name))
        except Exception as exc:  # noqa: BLE001
            entry["status"] = "failed: out of memory" if is_oom(exc) else failure(exc)
        finally:
            leaves.clear()
            free()
    for name, ms in interleaved(timer, calls, args.repeats, f"head N={n}").items():
        row["paths"][name]["ms"] = ms
    if device.type == "cuda":
        for name, (prep, run) in calls.items():
            prep()
            timer.sync()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            run()
            timer.sync()
            row["paths"][name]["peak_extra_gib"] = (torch.cuda.max_memory_allocated(device) - base) / GIB
            leaves.clear()
            free()
    return row


def print_head(sec: dict, dry: bool) -> None:
    print(f"\nToken statistics from the LM head, H = {sec['H']:,}, V = {sec['V']:,}, bf16: {sec['what']}"
          f"{f' ({DRY_NOTE})' if dry else ''}. ms, peak extra GiB, max error against float64 (log-prob / entropy):\n")
    names = list(sec["rows"][0]["paths"]) if sec["rows"] else []
    print("| N | with a gradient | " + " | ".join(names) + " | floor |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for row in sec["rows"]:
        cells = []
        for name in names:
            e = row["paths"][name]
            if e.get("status") != "ok":
                cells.append(e.get("status", ""))
                continue
            errs = "/".join(cell(e.get(k)) for k in ("logprob_err", "entropy_err") if e.get(k) is not None)
            cells.append(f"{cell(e.get('ms'))}, {cell(e.get('peak_extra_gib'))}, {errs}")
        print(f"| {row['tokens']:,} | {row['active']:.0%} | " + " | ".join(cells) + f" | {cell(row['floor_ms'])} |")
    print(flush=True)


def head_targets(rep: Report, sec: dict, dry: bool) -> None:
    verl = "veRL linear_cross_entropy"
    for row in sec["rows"]:
        p = row["paths"]
        ours, fallback, theirs = (p.get(k, {}).get("ms") for k in ("rlstab", "rlstab, torch row passes", verl))
        where = f"N = {row['tokens']:,}, {row['active']:.0%} active"
        if ours and theirs:
            limit = 0.8 if row["active"] == 1.0 else 0.5
            rep.target(f"LM head <= {limit}x veRL's linear_cross_entropy", ours / theirs, limit, ours / theirs <= limit,
                       where, True, dry)
        if fallback and theirs and row["active"] == 1.0:
            rep.target("LM head, torch row passes <= 2x veRL's", fallback / theirs, 2, fallback / theirs <= 2, where, True, dry)
        if ours and row["active"] == 1.0:
            rep.target("LM head <= 2x the 3-matmul floor", ours / row["floor_ms"], 2, ours / row["floor_ms"] <= 2, where,
                       True, dry)
        mine, verls = p.get("rlstab", {}).get("peak_extra_gib"), p.get(verl, {}).get("peak_extra_gib")
        if mine is not None and verls is not None:
            rep.target("LM head peak extra memory <= veRL's", mine, verls, mine <= verls, where, False, dry)
        err = max((p.get("rlstab", {}).get(k) or 0.0) for k in ("logprob_err", "entropy_err"))
        if p.get("rlstab", {}).get("status") == "ok":
            rep.target("LM head error against float64 <= 1e-4", err, 1e-4, err <= 1e-4, where, False, dry)


# ----------------------------------------------------------------------------- main


def print_targets(rep: Report) -> None:
    targets = rep.data["targets"]
    if not targets:
        return
    print("\nTargets of the issue:\n")
    for t in targets:
        verdict = {True: "PASS", False: "FAIL", None: "not judged (dry run)"}[t["pass"]]
        print(f"  {verdict:>21}  {t['target']} [{t['where']}]: {cell(t['value'])} (limit {cell(t['limit'])})")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton
    missing = missing_packages()
    if missing:
        print(
            f"benchmarks/gpu.py: missing Python packages: {', '.join(missing)}. rlstab needs torch, pydantic>=2.7, "
            "einops>=0.7 and pyyaml>=6; install the missing ones (offline: pip install --no-index --find-links "
            "<folder of wheels> " + " ".join(re.split(r"[<>= ]", m)[0] for m in missing) + ")",
            file=sys.stderr,
        )
        return 2
    for folder in (HERE, ROOT):  # the checkout's rlstab first, then loss_overhead.py beside this file
        if str(folder) not in sys.path[:2]:
            sys.path.insert(0, str(folder))
    global torch, rlstab
    torch = importlib.import_module("torch")
    try:
        rlstab = importlib.import_module("rlstab")
        importlib.import_module("rlstab.compiled")
    except ImportError as exc:
        print(f"benchmarks/gpu.py: cannot import rlstab from {ROOT}: {exc}", file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
            "`--dry` runs every path on CPU",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu" if args.dry else "cuda")
    if args.dry:
        torch.set_num_threads(min(torch.get_num_threads(), 2))
        # The GPU's paths on CPU tensors: checks left to the metrics' read, quantile bins on the device.
        importlib.import_module("rlstab.compiled").CompiledObjective.defer_checks = True
        importlib.import_module("rlstab.quantile").Population.ON_DEVICE = True
    timer = Timer(device)
    rep = Report(args)
    log(f"benchmarks/gpu.py{' --dry: ' + DRY_NOTE if args.dry else ''}; writing {rep.path}")
    rep.data["system"] = info = system_info(device)
    rep.save()
    for key in ("device_name", "torch", "cuda", "triton", "rlstab_commit", "date"):
        log(f"  {key}: {info.get(key)}")

    ceil = None
    need_ceilings = {"ceilings", "logits", "head", "loss"} & set(args.sections)
    t0 = time.perf_counter()
    if need_ceilings:
        log("section 1: ceilings")
        ceil = rep.data["ceilings"] = ceilings(device, timer, args.dry)
        rep.data["sections_s"]["ceilings"] = time.perf_counter() - t0
        rep.save()
        print(
            f"\nbf16 matmul {cell(ceil['bf16_matmul_tflops'])} TFLOP/s, fp32 matmul (no TF32) {cell(ceil['fp32_matmul_tflops'])} "
            f"TFLOP/s, copy {cell(ceil['copy_gbps'])} GB/s (read + write), read {cell(ceil['read_gbps'])} GB/s"
            + (f" ({DRY_NOTE})" if args.dry else f"; before: 780, 51, 2980 on {BEFORE['where']}")
            + "\n",
            flush=True,
        )
    sections = [
        ("logits", lambda: logits_section(rep, device, timer, ceil, args)),
        ("head", lambda: head_section(rep, device, timer, ceil, args)),
        ("loss", lambda: loss_section(rep, device, timer, ceil, args)),
        ("profile", lambda: profile_section(rep, device, timer, args)),
        ("presets", lambda: presets_section(rep, device, args)),
    ]
    for name, run in sections:
        if name not in args.sections:
            continue
        t0 = time.perf_counter()
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - one section failing leaves the others to run
            traceback.print_exc()
            rep.data.setdefault("errors", {})[name] = failure(exc)
        free()
        rep.data["sections_s"][name] = time.perf_counter() - t0
        rep.save()
    print_targets(rep)
    rep.data["total_s"] = time.perf_counter() - START
    rep.save()
    log(f"done in {rep.data['total_s']:.0f} s; {rep.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
