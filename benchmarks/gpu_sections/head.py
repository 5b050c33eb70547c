"""Section 3 of ``benchmarks/gpu.py``: token statistics from the LM head (``rlstab.stats.token_stats``).

N tokens (4,096 and 16,384), H = 4,096, V = 151,936, bf16, forward + backward of ``sum(g * logprob)``
to the hidden states and the head, with every token carrying a gradient and with 20% of them:
rlstab (Triton row kernels), rlstab with torch's row passes, the naive path, veRL's
``linear_cross_entropy`` (by ``import verl``, else from its kernel files alone: ``verl_kernel``) and
Liger-Kernel's fused linear cross entropy where they load, and the floor of three matmuls at the
measured bf16 rate. Per path: the median time, the error against float64 on the first 256 tokens,
and on CUDA two memory figures: ``peak_extra_gib``, the peak allocated during the call minus what
was allocated before it (the inputs), the gradients it returns included; and ``working_gib``, that
minus the bytes of the gradients it returns (``h.grad`` and ``W.grad``, outputs every path must
return): what the path needs beyond its inputs and outputs, the figure the memory target compares.
It is a subtraction, not a second measurement: for a path whose peak comes before its gradients
exist (in its forward, say) it understates that path's working memory by up to their size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from gpu_sections.common import DRY_NOTE, GIB, SLICE, cell, log, triton_installed
from gpu_sections.measure import Timer, failure, free, interleaved, is_oom, max_error
from gpu_sections.report import Report
from gpu_sections.verl_kernel import VerlKernel, load_linear_cross_entropy

VERL = "veRL linear_cross_entropy"


def head_paths(device, args, verl: VerlKernel | None) -> tuple[dict[str, Callable], dict[str, str]]:
    """The paths that run, name -> fn(h, W, labels) -> (logprob, entropy or None), each differentiable to
    h and W; and the columns that cannot, name -> status (on CPU without Triton, rlstab's Triton row kernels)."""
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
    absent = {}
    if device.type != "cuda" and not triton_installed():
        del paths["rlstab"]
        absent["rlstab"] = "unavailable (Triton is not installed: on CPU this column is its row kernels)"
    if device.type == "cuda" and verl is not None and verl.linear_cross_entropy is not None:
        lce = verl.linear_cross_entropy
        paths[VERL] = lambda h, w, y: lce(h, w, y, 1.0, "none", None)
    if device.type == "cuda" and not args.no_liger:
        try:
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

            def liger(h, w, y):  # the log-prob alone (minus its per-token cross entropy); no entropy
                out = LigerFusedLinearCrossEntropyFunction.apply(h, w, y, None, None, -100, 0.0, 0.0, "none")
                return (out[0] if isinstance(out, tuple) else out).neg(), None  # (loss, z_loss, ...) in recent versions

            paths["Liger fused linear cross entropy"] = liger
        except Exception as exc:  # noqa: BLE001
            log(f"  Liger-Kernel: not importable ({failure(exc)})")
    return paths, absent


def verl_entry(device, args) -> tuple[VerlKernel | None, dict]:
    """veRL's kernel (None with --no-verl) and what the report says of it: status, how loaded, version."""
    if args.no_verl:
        return None, {"status": "skipped: --no-verl"}
    verl = load_linear_cross_entropy()
    entry = {"status": verl.status, "loaded_by": verl.loaded_by, "version": verl.version,
             "import_error": verl.import_error}
    if verl.status == "ok" and device.type != "cuda":
        entry["status"] = "ok, not run: its kernels need CUDA"
    by = f", by {verl.loaded_by} (veRL {verl.version})" if verl.loaded_by else ""
    why = f"; import verl: {verl.import_error}" if verl.loaded_by and verl.import_error else ""
    log(f"  {VERL}: {entry['status']}{by}{why}")
    return verl, entry


def head_section(rep: Report, device, timer: Timer, ceil: dict, args) -> None:
    """Section 3: token_stats from hidden states and the LM head, forward + backward to both."""
    vocab, hidden_size = args.vocab, args.hidden
    sec = rep.data["head"] = {
        "H": hidden_size, "V": vocab, "dtype": "bf16",
        "what": "forward + backward of sum(g * logprob) to the hidden states and the LM head; entropy detached",
        "floor": "three matmuls of 2 N V H FLOPs at the measured bf16 rate",
        "memory": "peak_extra_gib: peak allocated during the call minus allocated before it (the inputs), the "
        "gradients it returns included; working_gib: the same minus the bytes of h.grad and W.grad",
        "rows": [],
    }
    verl, sec["verl"] = verl_entry(device, args)
    paths, absent = head_paths(device, args, verl)
    for n in args.head_tokens:
        for active in (1.0, 0.2):
            row = head_row(paths, n, active, hidden_size, vocab, device, timer, ceil, args)
            row["paths"] = {**{name: {"status": status} for name, status in absent.items()}, **row["paths"]}
            sec["rows"].append(row)
            rep.save()
            free()
    print_head(sec, args.dry)
    head_targets(rep, sec, args.dry)


def gradient_bytes(*leaves: torch.Tensor) -> int:
    """Bytes of the gradients held by ``leaves`` (each storage counted once)."""
    storages = {}
    for leaf in leaves:
        if leaf.grad is not None:
            storage = leaf.grad.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def head_row(paths, n, active, hidden_size, vocab, device, timer: Timer, ceil: dict, args) -> dict:
    """One row of the table: N tokens, a share ``active`` of them with a nonzero upstream gradient."""
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
            peak = torch.cuda.max_memory_allocated(device) - base
            row["paths"][name]["peak_extra_gib"] = peak / GIB
            row["paths"][name]["working_gib"] = (peak - gradient_bytes(*leaves[name])) / GIB
            leaves.clear()
            free()
    return row


def print_head(sec: dict, dry: bool) -> None:
    """The table as markdown: per path ms, peak extra GiB (working GiB), errors against float64."""
    print(f"\nToken statistics from the LM head, H = {sec['H']:,}, V = {sec['V']:,}, bf16: {sec['what']}"
          f"{f' ({DRY_NOTE})' if dry else ''}. ms, peak extra GiB (working GiB: without the gradients returned), "
          "max error against float64 (log-prob / entropy):\n")
    verl = sec.get("verl")
    if verl:
        by = f", veRL {verl.get('version')}, loaded by {verl['loaded_by']}" if verl.get("loaded_by") else ""
        print(f"{VERL}: {verl['status']}{by}\n")
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
            memory = "" if e.get("peak_extra_gib") is None else f"{cell(e['peak_extra_gib'])} ({cell(e['working_gib'])})"
            cells.append(f"{cell(e.get('ms'))}, {memory}, {errs}")
        print(f"| {row['tokens']:,} | {row['active']:.0%} | " + " | ".join(cells) + f" | {cell(row['floor_ms'])} |")
    print(flush=True)


def head_targets(rep: Report, sec: dict, dry: bool) -> None:
    """The issue's targets for the LM head: time against veRL's and the floor, working memory, error."""
    for row in sec["rows"]:
        p = row["paths"]
        ours, fallback, theirs = (p.get(k, {}).get("ms") for k in ("rlstab", "rlstab, torch row passes", VERL))
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
        mine, verls = p.get("rlstab", {}).get("working_gib"), p.get(VERL, {}).get("working_gib")
        if mine is not None and verls is not None:
            rep.target("LM head working memory <= veRL's", mine, verls, mine <= verls, where, False, dry)
        err = max((p.get("rlstab", {}).get(k) or 0.0) for k in ("logprob_err", "entropy_err"))
        if p.get("rlstab", {}).get("status") == "ok":
            rep.target("LM head error against float64 <= 1e-4", err, 1e-4, err <= 1e-4, where, False, dry)
