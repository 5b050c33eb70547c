"""Section 2 of ``benchmarks/gpu.py``: token statistics from logits, and the issue's targets for them.

At N x V (16,384 x 151,936, Qwen3's vocabulary), medians over interleaved repeats, the rows of
``logit_paths.ROWS`` for the paths of ``logit_paths.logit_paths``, and the floor: one read of the
logits at the measured read bandwidth without gradient, one read plus one write of the gradient at
the copy bandwidth with it. Per path: peak extra memory (``max_memory_allocated`` after a reset,
minus what was allocated before the call: the inputs), memory held after the call (what its outputs
keep alive), and the largest error of the log-prob, the entropy and the gradient on the first 256
tokens against float64. A path that raises on its first call is reported ``failed: ...`` and left
out of the timing.
"""

from __future__ import annotations

import torch

from gpu_sections.before import BEFORE
from gpu_sections.common import DRY_NOTE, GIB, SLICE, cell, gb, log
from gpu_sections.logit_paths import GRAD_MODES, MODES, ROWS, LogitPath, logit_paths
from gpu_sections.measure import Timer, failure, free, interleaved, is_oom, max_error
from gpu_sections.report import Report


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


def logits_row(row, x, labels, g, paths, timer, ceil, args, device) -> dict:
    """One row of the table: every path timed, its memory measured and its results checked against float64."""
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
    """One row of the table as markdown, with its floor and ratios."""
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
    """Section 2: the table in float32, then in bf16 (one set of logits alive at a time), then the targets."""
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
    """The issue's targets for the logits table: times against 5 and 8 ms, the floor and the trainer; memory; error."""
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
