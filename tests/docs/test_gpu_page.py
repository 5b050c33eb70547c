"""docs/gpu.md's measured tables are those of the stored runs (docs/gpu/h200-2026-11-28*.json), cell by cell."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "docs" / "gpu.md").read_text()
STORED = ROOT / "docs" / "gpu"
RUN_A = json.loads((STORED / "h200-2026-11-28-b644ec1.json").read_text())
RUN_B = json.loads((STORED / "h200-2026-11-28.json").read_text())
SUMMARY = json.loads((STORED / "h200-2026-11-28-run.json").read_text())
CHUNKS = (STORED / "h200-2026-11-28-chunks.txt").read_text()


def g3(x: float) -> str:
    """Three significant digits, trailing zeros kept, as the page writes a time or a ratio to the floor."""
    return f"{x:#.3g}".rstrip(".")


def test_the_runs_and_the_card():
    for run, commit in ((RUN_A, "b644ec1"), (RUN_B, "b644ec1")):
        system = run["system"]
        assert (system["device_name"], system["torch"], system["triton"], system["cuda"]) == (
            "NVIDIA H200", "2.11.0+cu130", "3.6.0", "13.0")
        assert system["rlstab_commit"] == commit and system["date"].startswith("2026-11-28")
    assert RUN_A["system"]["rlstab_uncommitted_files"] == 0 and RUN_B["system"]["rlstab_uncommitted_files"] > 0
    assert f"`python benchmarks/gpu.py`, {RUN_A['total_s']:.0f} s" in PAGE
    suite = SUMMARY["suite"]
    assert (suite["passed"], suite["failed"], suite["skipped"]) == (167, 0, 0)
    assert f"CUDA suite ({suite['passed']} passed, none failed or skipped, in {suite['seconds']:.0f} s)" in PAGE
    assert f"the benchmark ({RUN_B['total_s']:.0f} s)" in PAGE
    ceil = RUN_B["ceilings"]
    assert f"bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s" in PAGE
    assert f"float32 matmul {ceil['fp32_matmul_tflops']:.1f} TFLOP/s" in PAGE
    assert f"copy\n{ceil['copy_gbps'] / 1000:.2f} TB/s" in PAGE and f"read {ceil['read_gbps'] / 1000:.2f} TB/s" in PAGE


LOGIT_ROWS = ("float32, entropy in the graph", "float32, no gradient", "bf16, entropy in the graph",
              "bf16, no gradient", "bf16, entropy's gradient", "bf16, log-prob's gradient")  # the stored order


def test_the_logits_table():
    for name, row in zip(LOGIT_ROWS, RUN_B["token_stats"]["rows"], strict=True):
        p = row["paths"]
        ours, trainer, floor = p["rlstab"]["ms"], p["trainer"]["ms"], row["floor_ms"]
        memory = "'s gradient" not in name
        cells = [f"{g3(ours)}, 0.0002 GiB" if memory else g3(ours),
                 f"{g3(trainer)}, {p['trainer']['peak_extra_gib']:.3g} GiB" if memory else g3(trainer),
                 g3(p["liger"]["ms"]) if p["liger"].get("ms") else "",
                 g3(floor), g3(ours / floor), f"{ours / trainer:#.2g}"]
        line = (f"| {name} | " + " | ".join(cells) + " |").replace(" |  |", " | |")
        assert line in PAGE, line
        assert p["rlstab"].get("peak_extra_gib", 0) < 0.00025 or not memory
        assert max(p["rlstab"].get("logprob_err") or 0, p["rlstab"].get("entropy_err") or 0) <= 2.3e-6


def test_the_lm_head_table():
    names = ("rlstab", "veRL linear_cross_entropy", "Liger fused linear cross entropy", "naive")
    for row in RUN_B["head"]["rows"]:
        p = row["paths"]
        mem = {k: f"{g3(p[k]['ms'])}, {p[k]['working_gib']:.3f} GiB" for k in names}
        cells = [mem["rlstab"], g3(p["rlstab, torch row passes"]["ms"]), mem["veRL linear_cross_entropy"],
                 mem["Liger fused linear cross entropy"], mem["naive"], g3(row["floor_ms"])]
        line = f"| {row['tokens']:,} | {row['active']:.0%} | " + " | ".join(cells) + " |"
        assert line in PAGE, line
    assert RUN_B["head"]["verl"]["loaded_by"] == "kernel files alone" and RUN_B["head"]["verl"]["version"] == "0.9.1"
    before = {r["tokens"]: r["paths"]["rlstab"] for r in RUN_A["head"]["rows"] if r["active"] == 1.0}
    assert f"took {g3(before[4096]['ms'])} and\n{g3(before[16384]['ms'])} ms" in PAGE


def test_the_chunk_table_and_the_chosen_chunks():
    for line in CHUNKS.splitlines():
        m = re.fullmatch(r"\| ([\d,]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", line)
        if not m:
            continue
        n, mib, fwd, bwd, total, working = m.groups()
        shown = "(first call)" if (n, mib) == ("4,096", "32") else f"{working} GiB"
        row = f"| {n} | {mib} MiB | {g3(float(fwd))} | {g3(float(bwd))} | {g3(float(total))} | {shown} |"
        assert row in PAGE, row
    verl = {r["tokens"]: r["paths"]["veRL linear_cross_entropy"] for r in RUN_B["head"]["rows"] if r["active"] == 1.0}
    assert "| 4,096 | 48 | 9.50 | 24.87 | 34.37 | 0.133 |" in CHUNKS  # rlstab's chunks at N = 4,096 ...
    assert "| 16,384 | 128 | 35.04 | 103.59 | 138.63 | 0.438 |" in CHUNKS  # ... and 2,048 columns at 16,384
    assert f"{34.37 / verl[4096]['ms']:.2f}" == f"{138.63 / verl[16384]['ms']:.2f}" == "0.72"
    assert 0.133 <= round(verl[4096]["working_gib"], 3) and 0.438 <= round(verl[16384]["working_gib"], 3)


def test_the_loss_table_and_its_targets():
    def line(row, label):
        ms = row["ms"]
        keys = ("hand-written", "stapo whole", "stapo frozen", "grpo frozen", "stare frozen")
        return f"| {label} | " + " | ".join(g3(ms[k]) for k in keys) + f" | {row['floor_ms']:.3f} |"

    for row in RUN_B["loss"]["rows"]:
        assert line(row, f"{row['tokens'] >> 20}M") in PAGE, line(row, "")
    four = next(r for r in RUN_A["loss"]["rows"] if r["tokens"] == 4 << 20)
    assert line(four, "4M, run A") in PAGE
    def target(run, word):
        return next(t for t in run["targets"] if "stapo" in t["target"] and word in t["target"])["value"]

    assert f"| {target(RUN_B, 'frozen'):.2f} × ({target(RUN_A, 'frozen'):.2f} × in run A) | FAIL |" in PAGE
    assert f"| {target(RUN_B, 'whole'):.2f} × ({target(RUN_A, 'whole'):.2f} ×) | FAIL |" in PAGE
