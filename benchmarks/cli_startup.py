"""Start-up time of the torch-free commands (validate, explain, presets, schema) against ``import torch``.

These commands run in pre-commit hooks and editors, so they import no torch. Each command runs in a
fresh Python process, alternated with a fresh ``python -c "import torch"`` in the same run,
``--repeats`` times; the table gives the medians of the wall times (interpreter start included,
as a user sees it) and their ratios to ``import torch``, with whether the command imported torch.

Every installed plugin is loaded, as the commands load them: a plugin that imports torch at its
top (rather than from ``rlstab.lazy``) makes every command import it, and the table says so.

    python benchmarks/cli_startup.py                 # 7 repeats
    python benchmarks/cli_startup.py --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# `rlstab ARGS`, as the console script runs it; the last line on stderr says whether torch was imported.
DRIVER = """
import sys
from rlstab.cli import main
code = main(sys.argv[1:])
print("torch" in sys.modules, file=sys.stderr)
sys.exit(code)
"""

COMMANDS = {
    "validate": ["validate", str(ROOT / "rlstab" / "presets" / "stapo.yaml")],
    "explain": ["explain", "stapo"],
    "presets": ["presets"],
    "schema": ["schema"],
}


def timed(argv: list[str]) -> tuple[float, str]:
    """Wall seconds of a fresh process, and its stderr."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    return time.perf_counter() - start, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    baseline = [sys.executable, "-c", "import torch"]
    times: dict[str, list[float]] = {"import torch": [], **{name: [] for name in COMMANDS}}
    imported: dict[str, str] = {"import torch": "yes"}
    timed(baseline)  # a first start reads the files from disk; not timed
    for i in range(args.repeats):
        for name, command in COMMANDS.items():
            times["import torch"].append(timed(baseline)[0])
            seconds, err = timed([sys.executable, "-c", DRIVER, *command])
            times[name].append(seconds)
            imported[name] = "yes" if err.strip().splitlines()[-1] == "True" else "no"
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    base = statistics.median(times["import torch"])
    print(f"median of {args.repeats} repeats\n")
    print("| command | median s | ratio to import torch | imports torch |")
    print("|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        label = name if name == "import torch" else f"rlstab {name}"
        print(f"| {label} | {median:.3f} | {median / base:.2f} | {imported[name]} |")


if __name__ == "__main__":
    main()
