"""What the registry costs: ``import rlstab`` and building objectives, against the closed unions it replaced.

The baseline is rlstab at ``--baseline`` (the last commit with hand-written unions), extracted
with ``git archive`` into a temporary folder; the current code is this working tree. Both run in
fresh Python processes, alternated ``--repeats`` times (medians), in the same run:

- ``import``: ``import rlstab``, as ``python -X importtime`` reports it (cumulative microseconds);
- ``first``: the first ``rlstab.load`` of a preset in a fresh process: the objective's schema is
  built, and with the registry the ``rlstab.components`` entry points are read and loaded, once;
- ``load``: later ``rlstab.load`` calls of every preset (YAML, ``extends``, validation), per call;
- ``validate``: ``Objective.model_validate`` of an already-parsed preset dict, per call.

Absolute times are this machine's; the ratios to the baseline are the point.

    python benchmarks/registry.py                   # baseline 241d5e5, 5 repeats
    python benchmarks/registry.py --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMING = r"""
import json, time
t0 = time.perf_counter()
import rlstab
from rlstab.loading import load_data
from rlstab.objective import Objective
t1 = time.perf_counter()
rlstab.load("stapo")
t2 = time.perf_counter()
names = rlstab.preset_names()
n = 0
start = time.perf_counter()
while time.perf_counter() - start < 1.0:
    for name in names:
        rlstab.load(name)
        n += 1
t3 = time.perf_counter()
data = [load_data(name)[0] for name in names]
m = 0
start = time.perf_counter()
while time.perf_counter() - start < 1.0:
    for d in data:
        Objective.model_validate(d)
        m += 1
t4 = time.perf_counter()
print(json.dumps({"first": t2 - t1, "load": (t3 - t2) / n, "validate": (t4 - start) / m}))
"""


def run(source: Path, code: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(source)}
    env.pop("RLSTAB_IN_PROCESS_KINDS", None)
    return subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env, check=True, cwd=source)


def import_time(source: Path) -> float:
    """Cumulative microseconds of ``import rlstab`` (``-X importtime``'s line for the top-level package)."""
    err = run(source, ["-X", "importtime", "-c", "import rlstab"]).stderr
    (line,) = [row for row in err.splitlines() if row.rstrip().endswith("| rlstab")]
    return float(line.split("|")[1])


def measure(source: Path) -> dict[str, float]:
    found = json.loads(run(source, ["-c", TIMING]).stdout)
    found["import"] = import_time(source) / 1e6
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="241d5e5", help="the commit with closed unions (default: 241d5e5)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "rlstab"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        runs = {"baseline": [], "registry": []}
        for i in range(args.repeats):
            for label, source in (("baseline", base), ("registry", ROOT)):
                runs[label].append(measure(source))
            print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    print(f"{'measure':<10} {'baseline':>12} {'registry':>12} {'ratio':>7}")
    for key, unit, scale in (("import", "ms", 1e3), ("first", "ms", 1e3), ("load", "us", 1e6), ("validate", "us", 1e6)):
        b = statistics.median(r[key] for r in runs["baseline"])
        r = statistics.median(r[key] for r in runs["registry"])
        print(f"{key:<10} {b * scale:>9.1f} {unit} {r * scale:>9.1f} {unit} {r / b:>7.3f}")


if __name__ == "__main__":
    main()
