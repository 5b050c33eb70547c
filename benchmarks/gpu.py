"""One command on a lent GPU: the card's ceilings, token statistics from logits, the compiled loss, kernels and syncs.

    python benchmarks/gpu.py                 # everything: 101 s on one H200 (see "Timed" below)
    python benchmarks/gpu.py --quick         # fewer repeats, the loss at 4M tokens only, no torch.compile
    python benchmarks/gpu.py --dry           # every path on tiny CPU tensors (CI), no timing claims
    python benchmarks/gpu.py --sections logits --tokens 8k --vocab 64k

It runs from a checkout (the checkout goes first on ``sys.path``), installed into the Python that
runs it: ``pip install --no-deps -e .`` in the checkout's root, or rlstab's wheel. rlstab registers
its components from its installed entry points; without them the sections that build rlstab's
objectives (loss, profile, presets) cannot run, and the command says so in one line and marks them
failed. It needs torch, pydantic, einops and pyyaml (it says which are missing and stops); Triton,
veRL and Liger-Kernel are used where they load. It prints markdown tables and writes everything as
JSON (``--out``; default ``$OUT/gpu.json`` when ``OUT`` is set, else ``gpu.json`` here), rewritten
after each section so that a run cut short still leaves what it measured.

Each section is a module of ``benchmarks/gpu_sections/`` (its docstring says what it measures):

1. **The card and its ceilings** (``ceilings``): torch, Triton, CUDA, the device, the date; bf16 and
   float32 matmul TFLOP/s, copy and read bandwidth.
2. **Token statistics from logits** (``logits``, its paths in ``logit_paths``) at N x V (16,384 x
   151,936, Qwen3's vocabulary): entropy and log-prob with and without gradient, rlstab against the
   trainer's own way (veRL's functions when ``import verl`` works, else the same formulas written
   here), Liger-Kernel and the floor; time, memory, error against float64; the issue's targets.
3. **Token statistics from the LM head** (``head``), N = 4,096 and 16,384, H = 4,096, V = 151,936,
   bf16, forward + backward to the hidden states and the head: rlstab, its torch row passes, the
   naive path, veRL's ``linear_cross_entropy`` (by ``import verl``, else from veRL's kernel files
   alone: ``verl_kernel``; the table and the JSON say which, and veRL's version), Liger-Kernel, the
   three-matmul floor; time, peak extra and working memory (without the gradients returned), error.
4. **The compiled loss** (``loss``), B x 1024 tokens (1M, 4M, 16M), forward + backward: the
   hand-written PPO-clip of ``benchmarks/loss_overhead.py``, ``stapo``, ``grpo`` and ``stare``.
5. **Kernels and host synchronisations** (``syncs``) per loss call + backward at 4M tokens, then
   every preset's frozen-step and whole-step call under ``host_syncs()``.

Timing: CUDA events on CUDA, with the queue drained before each call, so that a call's time
includes the launches and syncs of its host code; ``time.perf_counter`` on CPU. ``--dry`` runs
every path on tiny CPU tensors, the Triton kernels under Triton's interpreter, and judges only the
targets that are not timings (errors, syncs).

Timed: the full run took 101 s and ``--quick`` 67 s on one NVIDIA H200 (torch 2.11.0+cu130,
Triton 3.6.0) on 2026-11-28, without a veRL column in the LM-head table (``import verl`` failed
there; its kernel files alone now load).

Exit status, in a real run and a dry one alike: 0 when every path that should run ran, whatever the
targets say (a FAIL is a measured result: printed, and kept in the JSON); 1 when any did not: a
section that raised or could not run, or a path whose status is ``failed: ...`` (it raised or ran
out of memory; Triton installed but rlstab's kernels not importing; veRL installed but its kernel
not loading; rlstab's components not registered). A path absent by design or by install (veRL or
Liger-Kernel not installed, a mode a path does not have: ``unavailable``, ``skipped``, ``n/a``) is
not a failure. The failures are listed after the targets and under ``failed`` in the JSON. 2 when
it could not start (a missing requirement; no CUDA device without ``--dry``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
import traceback
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # gpu_sections/ beside this file, however it is run
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_sections.common import DRY_NOTE, HERE, ROOT, START, log, missing_packages, parse_size  # noqa: E402

SECTIONS = ("ceilings", "logits", "head", "loss", "profile", "presets")
NEED_CEILINGS = ("logits", "head", "loss")  # the sections whose floors are computed from the ceilings


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


def main(argv: list[str] | None = None) -> int:
    """Run the sections asked for; the exit status is 0, 1 (a path failed) or 2 (could not start)."""
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
    torch = importlib.import_module("torch")
    try:
        importlib.import_module("rlstab")
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
    return run_sections(args, device)


def run_sections(args: argparse.Namespace, device) -> int:
    """Every section asked for, in order, each failure kept; the targets and the failures printed."""
    from gpu_sections import components
    from gpu_sections.ceilings import ceilings, print_ceilings, system_info
    from gpu_sections.head import head_section
    from gpu_sections.logits import logits_section
    from gpu_sections.loss import loss_section
    from gpu_sections.measure import Timer, failure, free
    from gpu_sections.report import Report, failed_paths, print_failures, print_targets
    from gpu_sections.syncs import presets_section, profile_section

    timer = Timer(device)
    rep = Report(args)
    log(f"benchmarks/gpu.py{' --dry: ' + DRY_NOTE if args.dry else ''}; writing {rep.path}")
    rep.data["system"] = info = system_info(device)
    rep.save()
    for key in ("device_name", "torch", "cuda", "triton", "rlstab_commit", "date"):
        log(f"  {key}: {info.get(key)}")
    unregistered = bool(set(components.SECTIONS) & set(args.sections)) and not components.registered()
    if unregistered:
        print(f"benchmarks/gpu.py: {components.NOT_INSTALLED}; the sections "
              f"{', '.join(s for s in components.SECTIONS if s in args.sections)} are marked failed", flush=True)

    ceil = None
    if set(NEED_CEILINGS + ("ceilings",)) & set(args.sections):
        log("section 1: ceilings")
        t0 = time.perf_counter()
        try:
            ceil = rep.data["ceilings"] = ceilings(device, timer, args.dry)
            print_ceilings(ceil, args.dry)
        except Exception as exc:  # noqa: BLE001 - reported; the sections that need the ceilings are marked failed
            traceback.print_exc()
            rep.fail_section("ceilings", failure(exc))
        rep.data["sections_s"]["ceilings"] = time.perf_counter() - t0
        rep.save()
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
        if unregistered and name in components.SECTIONS:
            rep.fail_section(name, components.NOT_INSTALLED)
            continue
        if ceil is None and name in NEED_CEILINGS:
            rep.fail_section(name, "failed: not run, the ceilings it is measured against failed")
            continue
        t0 = time.perf_counter()
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - one section failing leaves the others to run
            traceback.print_exc()
            rep.fail_section(name, failure(exc))
        free()
        rep.data["sections_s"][name] = time.perf_counter() - t0
        rep.save()
    print_targets(rep)
    failed = rep.data["failed"] = failed_paths(rep.data)
    print_failures(failed)
    rep.data["total_s"] = time.perf_counter() - START
    rep.save()
    log(f"done in {rep.data['total_s']:.0f} s; {rep.path}" + (f"; {len(failed)} failed, exit status 1" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
