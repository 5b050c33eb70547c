"""Section 4 of ``benchmarks/gpu.py``: the compiled loss against a hand-written one, forward + backward.

B x 1024 tokens (1M, 4M, 16M), medians over interleaved repeats: the hand-written eager PPO-clip of
``benchmarks/loss_overhead.py`` (and, at the profiled size, the same function under
``torch.compile``); ``stapo`` as its own step (``loss_fn(batch)``); ``stapo``, ``grpo`` from rewards
(groups of 8) and ``stare`` in a frozen step (``stats = loss_fn.gather([batch])`` beforehand,
``loss_fn(batch, step=stats)``); the floor, 17 bytes per token at the copy bandwidth (log-probs, old
log-probs, entropy and the gradient in float32, the mask in bytes). rlstab's objectives need its
components registered (its entry points: rlstab installed); the command checks that first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

import rlstab
from gpu_sections.before import BEFORE
from gpu_sections.common import DRY_NOTE, cell, fmt_tokens, gb, log
from gpu_sections.measure import Timer, failure, free, interleaved
from gpu_sections.report import Report

GROUP = 8  # responses per prompt for the GRPO rows
EPS_LOW, EPS_HIGH = 0.2, 0.28  # the hand-written loss's clip range, as in benchmarks/loss_overhead.py
LOSS_BYTES_PER_TOKEN = 17  # logprobs 4 + old 4 + mask 1 + entropy 4 + gradient 4


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
    """Section 4: the table at each size of ``--loss-tokens``, then the targets at ``--profile-tokens``."""
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
    """The table as markdown, with the issue's "before" times under each size."""
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
