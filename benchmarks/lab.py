"""The stability lab's cost: per-run overhead against a bare trainer run, and grid throughput.

1. **Per-run overhead.** One run of ``grpo`` under the ``default`` regime for ``--steps`` steps,
   timed two ways, alternated ``--repeats`` times in the same process (medians):

   - bare: ``rlstab.trainer.run.Run``, the embedded trainer's run with nothing around it (the
     warm start loaded from the cache, a fresh policy copy), stepped to the end;
   - lab: ``rlstab.lab.run.execute`` on the same objective, seed, regime and steps into a fresh
     folder: the same loop plus the run's spec, metrics rows written as it goes and a checkpoint
     every ``--checkpoint-every`` steps (weights, Adam, RNG states, rows), and the summary.

   The target is lab / bare <= 1.1.
2. **Grid throughput.** A grid of ``--grid-runs`` runs (grpo and stapo, seeds 0, 1, ...) of
   ``--steps`` steps, through ``rlstab.lab.compare`` with 1 and then 2 local workers, each into a
   fresh folder: runs per hour, and the speed-up of 2 workers. Warm starts are cached beforehand,
   so neither side trains one.

Absolute times are this machine's; the ratios are the point.

    python benchmarks/lab.py                    # 20 steps, 3 repeats, a grid of 4 runs
    python benchmarks/lab.py --steps 10 --repeats 5 --grid-runs 8
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlstab.lab import compare, load_regime
from rlstab.lab.run import execute, train_config
from rlstab.lab.spec import RunSpec
from rlstab.loading import load
from rlstab.trainer.models import load_policy
from rlstab.trainer.run import Run
from rlstab.trainer.tasks import get_task


def overhead(steps: int, repeats: int, checkpoint_every: int, cache: Path) -> tuple[float, float]:
    objective = load("grpo")
    spec = RunSpec("grpo", objective.to_yaml(), objective.fingerprint(), load_regime("default"), "add2", "tiny", 0, steps)
    task = get_task("add2")
    bare, lab = [], []
    torch.set_num_threads(1)
    for _ in range(repeats):
        start = time.perf_counter()
        policy = load_policy("tiny", task, seed=0, cache_dir=cache)  # the lab loads it too
        run = Run(objective, train_config(spec), task, policy=copy.deepcopy(policy))
        run.start()
        while not run.done:
            run.step()
        bare.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            execute(spec, folder, cache_dir=cache, checkpoint_every=checkpoint_every)
            lab.append(time.perf_counter() - start)
    return statistics.median(bare), statistics.median(lab)


def throughput(runs: int, steps: int, workers: int, cache: Path) -> float:
    seeds = max(1, runs // 2)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        compare(["grpo", "stapo"], seeds=seeds, steps=steps, workers=workers, out=out, cache_dir=cache, progress=False)
        elapsed = time.perf_counter() - start
    return 2 * seeds / elapsed * 3600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--grid-runs", type=int, default=4)
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache_dir or tmp)
        for seed in range(max(1, args.grid_runs // 2)):  # warm starts outside every timing
            load_policy("tiny", "add2", seed=seed, cache_dir=cache)
        print(f"per-run overhead: grpo, default regime, {args.steps} steps, median of {args.repeats}", file=sys.stderr)
        bare, lab = overhead(args.steps, args.repeats, args.checkpoint_every, cache)
        print(f"grid throughput: {args.grid_runs} runs of {args.steps} steps, 1 then 2 workers", file=sys.stderr)
        one = throughput(args.grid_runs, args.steps, 1, cache)
        two = throughput(args.grid_runs, args.steps, 2, cache)
    print("| measure | value |")
    print("|---|---:|")
    print(f"| bare trainer run ({args.steps} steps) | {bare:.1f} s |")
    print(f"| lab run, checkpoint every {args.checkpoint_every} | {lab:.1f} s |")
    print(f"| lab / bare | {lab / bare:.3f} |")
    print(f"| grid, 1 worker | {one:.0f} runs/hour |")
    print(f"| grid, 2 workers | {two:.0f} runs/hour |")
    print(f"| 2 workers / 1 worker | {two / one:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
