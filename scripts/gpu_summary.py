"""The summary of one scripts/gpu.sh run: ``OUT/gpu-run.json`` from the CUDA suite's JUnit XML and the
benchmark's ``gpu.json``, and a few lines on the terminal (the card, the suite's counts, every target).

    python scripts/gpu_summary.py OUT --suite-rc 0 --suite-s 95 --benchmark-rc 0 --benchmark-s 110
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def suite_counts(xml: Path) -> dict:
    """Tests, passed, failed, errors, skipped, and the first line of each failure, from pytest's JUnit XML."""
    if not xml.exists():
        return {"missing": str(xml.name)}
    root = ET.parse(xml).getroot()
    cases = list(root.iter("testcase"))
    failures, skipped = [], 0
    for case in cases:
        for kind in ("failure", "error"):
            for node in case.findall(kind):
                first = (node.get("message") or node.text or "").strip().splitlines()[:1]
                failures.append(f"{case.get('classname')}::{case.get('name')} ({kind}): {''.join(first)[:300]}")
        skipped += bool(case.findall("skipped"))
    return {"tests": len(cases), "failed": len(failures), "skipped": skipped,
            "passed": len(cases) - len(failures) - skipped, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--suite-rc", type=int, required=True)
    p.add_argument("--suite-s", type=float, required=True)
    p.add_argument("--benchmark-rc", type=int, required=True)
    p.add_argument("--benchmark-s", type=float, required=True)
    args = p.parse_args(argv)
    bench = json.loads((args.out / "gpu.json").read_text()) if (args.out / "gpu.json").exists() else {}
    targets = bench.get("targets", [])
    summary = {
        "system": bench.get("system", {}),
        "suite": {"rc": args.suite_rc, "seconds": args.suite_s, **suite_counts(args.out / "cuda-suite.xml")},
        "benchmark": {
            "rc": args.benchmark_rc, "seconds": args.benchmark_s, "failed": bench.get("failed", []),
            "targets_passed": sum(t.get("pass") is True for t in targets),
            "targets_failed": sum(t.get("pass") is False for t in targets),
            "targets": targets,
        },
    }
    (args.out / "gpu-run.json").write_text(json.dumps(summary, indent=1) + "\n")
    system, suite, b = summary["system"], summary["suite"], summary["benchmark"]
    print(f"\n{system.get('device_name', 'no card named')}, torch {system.get('torch')}, Triton {system.get('triton')}, "
          f"CUDA {system.get('cuda')}, rlstab {system.get('rlstab_commit')}, {system.get('date')}")
    print(f"CUDA suite: {suite.get('passed')} passed, {suite.get('failed')} failed, {suite.get('skipped')} skipped "
          f"in {args.suite_s:.0f} s (rc {args.suite_rc})")
    for line in suite.get("failures", []):
        print(f"  {line}")
    print(f"benchmark: {b['targets_passed']} targets PASS, {b['targets_failed']} FAIL in {args.benchmark_s:.0f} s "
          f"(rc {args.benchmark_rc})")
    for line in b["failed"]:
        print(f"  failed: {line}")
    for t in targets:
        if t.get("pass") is False:
            print(f"  FAIL {t['target']} [{t['where']}]: {t['value']:.3g} (limit {t['limit']:.3g})")
    print(f"written: {args.out / 'gpu-run.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
