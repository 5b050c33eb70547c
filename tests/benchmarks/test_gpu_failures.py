"""``benchmarks/gpu.py`` exits 1 when a path that should run failed, and 0 when only targets failed.

A dry run once exited 0 with "failed: InterpreterError" in every Triton row. Here rlstab's Triton
forward is made to raise (in the child process only, before the command runs) and the command must
exit 1 and name the failed paths; and a checkout whose components are not registered (its entry
points hidden) must say so in one line and mark the sections that need them failed, once each.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
TINY = ["--dry", "--tokens", "16", "--vocab", "64", "--repeats", "1", "--warmup", "0"]

BROKEN_TRITON = r"""
import os, runpy, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
import rlstab.stats.triton.function as function

def forward(*args, **kwargs):
    raise RuntimeError("the Triton forward broken on purpose")

function.forward = forward
sys.exit(runpy.run_path(sys.argv[1], run_name="gpu_benchmark")["main"](sys.argv[2:]))
"""

NO_ENTRY_POINTS = r"""
import importlib.metadata as metadata, runpy, sys
every = metadata.entry_points

def entry_points(**params):  # rlstab's own components hidden, as in a checkout never installed
    return metadata.EntryPoints(()) if params.get("group") == "rlstab.components" else every(**params)

metadata.entry_points = entry_points
sys.exit(runpy.run_path(sys.argv[1], run_name="gpu_benchmark")["main"](sys.argv[2:]))
"""


def run(child: str, out: Path, *argv: str) -> tuple[int, str, dict]:
    done = subprocess.run(
        [sys.executable, "-c", child, str(SCRIPT), *TINY, "--out", str(out), *argv],
        capture_output=True, text=True, timeout=600, cwd=out.parent,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, done.stdout + done.stderr, report


def load_section(name: str):
    """A module of benchmarks/gpu_sections/, imported as the command imports it."""
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # puts gpu_sections on sys.path
    return importlib.import_module(f"gpu_sections.{name}")


def test_a_path_that_raises_makes_the_exit_status_1_and_is_named(tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("no Triton: the Triton path is unavailable here, not run")
    rc, printed, report = run(BROKEN_TRITON, tmp_path / "gpu.json", "--sections", "logits")
    assert rc == 1, printed[-4000:]
    rows = report["token_stats"]["rows"]
    assert len(rows) == 6
    for row in rows:
        assert row["paths"]["rlstab triton"]["status"] == "failed: RuntimeError: the Triton forward broken on purpose"
        assert row["paths"]["rlstab"]["status"] == "ok"  # the CPU path does not use the Triton forward
    assert report["failed"] == [
        f"token_stats / {row['row']} / rlstab triton: failed: RuntimeError: the Triton forward broken on purpose"
        for row in rows
    ]
    assert "Failed: 6 (the exit status is 1)" in printed
    assert "6 failed, exit status 1" in printed


def test_components_not_registered_fail_each_section_that_needs_them_once(tmp_path):
    rc, printed, report = run(NO_ENTRY_POINTS, tmp_path / "gpu.json", "--sections", "loss", "profile", "presets")
    assert rc == 1, printed[-4000:]
    reason = load_section("components").NOT_INSTALLED
    said = [line for line in printed.splitlines() if line.startswith("benchmarks/gpu.py: failed: rlstab's components")]
    assert said == [f"benchmarks/gpu.py: {reason}; the sections loss, profile, presets are marked failed"]
    assert "pip install --no-deps -e ." in reason
    assert report["errors"] == {"loss": reason, "profile": reason, "presets": reason}
    assert not {"loss", "profile", "presets"} & set(report)  # no row ran, so none failed on its own
    assert report["failed"] == [f"section {name}: {reason}" for name in ("loss", "profile", "presets")]


def test_only_failed_paths_and_sections_count_not_absent_paths_or_failed_targets():
    report = load_section("report")
    data = {
        "errors": {"head": "failed: ValueError: broken"},
        "token_stats": {
            "triton": "triton path: unavailable (ModuleNotFoundError: No module named 'triton')",
            "rows": [{"row": "bf16 no grad", "paths": {
                "rlstab": {"status": "ok"},
                "rlstab triton": {"status": "triton path: unavailable (ModuleNotFoundError: No module named 'triton')"},
                "trainer": {"status": "ok, but it changed its input: the logits were made again"},
                "liger": {"status": "n/a: no entropy"},
            }}],
        },
        "head": {"verl": {"status": "unavailable (veRL is not installed: ...)"}, "rows": [
            {"tokens": 4096, "active": 0.2, "paths": {"rlstab": {"status": "ok"}, "naive": {"status": "failed: out of memory"}}},
        ]},
        "loss": {"rows": [{"tokens": 4 << 20, "status": {"hand-written": "ok", "stapo whole": "failed: KeyError: 'x'"}}]},
        "profile": {"paths": {"stapo frozen": {"status": "ok"}}},
        "presets": {"presets": {"grpo": {"status": "ok"}, "stapo": {"status": "failed: TypeError: y"}}},
        "targets": [{"target": "bf16 without gradient <= 5 ms", "pass": False}],
    }
    assert report.failed_paths(data) == [
        "section head: failed: ValueError: broken",
        "head / N = 4,096, 20% active / naive: failed: out of memory",
        "loss / 4M tokens / stapo whole: failed: KeyError: 'x'",
        "presets / stapo: failed: TypeError: y",
    ]
    data["token_stats"]["triton"] = "triton path: failed: ImportError: z"  # Triton there, rlstab's kernels not
    data["head"]["verl"]["status"] = "failed: ModuleNotFoundError: No module named 'packaging'"  # veRL there, its kernel not
    assert report.failed_paths(data)[1:3] == [
        "token_stats, rlstab's Triton kernels: failed: ImportError: z",
        "head, veRL's linear_cross_entropy: failed: ModuleNotFoundError: No module named 'packaging'",
    ]
