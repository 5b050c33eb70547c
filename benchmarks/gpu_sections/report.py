"""The JSON report of ``benchmarks/gpu.py``, its targets, and which paths failed (the exit status).

A path's status is ``ok`` (perhaps with a note), absent by design or by install (``n/a: ...``,
``skipped: ...``, ``unavailable (...)``: veRL or Liger-Kernel not installed, a mode a path does not
have), or ``failed: ...`` (it raised, ran out of memory, or should have loaded and did not). Only
the last counts against the run: ``failed_paths`` lists every such path and every section that
raised, and the command exits 1 when that list is not empty. A target that fails is a measured
result, not a crash: it is printed and kept in the JSON, and the exit status does not depend on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from gpu_sections.before import BEFORE
from gpu_sections.common import DRY_NOTE, cell, fmt_tokens


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
        """One of the issue's targets; a timing is not judged in a dry run (``pass`` None)."""
        judged = None if (timing and dry) else ok
        self.data["targets"].append(
            {"target": name, "where": where, "value": value, "limit": limit, "pass": judged, "timing": timing}
        )

    def fail_section(self, name: str, why: str) -> None:
        """A section that raised, or could not run: kept under ``errors``, counted by ``failed_paths``."""
        self.data.setdefault("errors", {})[name] = why

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


def is_failure(status) -> bool:
    """Whether a path's status says it should have run and did not (``failed: ...``)."""
    return isinstance(status, str) and status.startswith("failed")


def failed_paths(data: dict) -> list[str]:
    """``where: status`` of every section that raised and every path that failed, in the report's order."""
    out = [f"section {name}: {why}" for name, why in data.get("errors", {}).items()]
    logits = data.get("token_stats", {})
    triton = logits.get("triton", "").removeprefix("triton path: ")
    if is_failure(triton):
        out.append(f"token_stats, rlstab's Triton kernels: {triton}")
    for row in logits.get("rows", []):
        out += [f"token_stats / {row['row']} / {p}: {e['status']}" for p, e in row["paths"].items() if is_failure(e.get("status"))]
    head = data.get("head", {})
    if is_failure(head.get("verl", {}).get("status")):
        out.append(f"head, veRL's linear_cross_entropy: {head['verl']['status']}")
    for row in head.get("rows", []):
        where = f"head / N = {row['tokens']:,}, {row['active']:.0%} active"
        out += [f"{where} / {p}: {e['status']}" for p, e in row["paths"].items() if is_failure(e.get("status"))]
    for row in data.get("loss", {}).get("rows", []):
        where = f"loss / {fmt_tokens(row['tokens'])} tokens"
        out += [f"{where} / {p}: {status}" for p, status in row["status"].items() if is_failure(status)]
    for p, e in data.get("profile", {}).get("paths", {}).items():
        if is_failure(e.get("status")):
            out.append(f"profile / {p}: {e['status']}")
    for p, e in data.get("presets", {}).get("presets", {}).items():
        if is_failure(e.get("status")):
            out.append(f"presets / {p}: {e['status']}")
    return out


def print_targets(rep: Report) -> None:
    """The issue's targets, one line each: PASS, FAIL, or not judged (a timing in a dry run)."""
    targets = rep.data["targets"]
    if not targets:
        return
    print("\nTargets of the issue:\n")
    for t in targets:
        verdict = {True: "PASS", False: "FAIL", None: "not judged (dry run)"}[t["pass"]]
        print(f"  {verdict:>21}  {t['target']} [{t['where']}]: {cell(t['value'])} (limit {cell(t['limit'])})")
    print(flush=True)


def print_failures(failed: list[str]) -> None:
    """The paths that should have run and did not, after the targets (the reason the exit status is 1)."""
    if not failed:
        return
    print(f"\nFailed: {len(failed)} (the exit status is 1):\n")
    for line in failed:
        print(f"  {line}")
    print(flush=True)
