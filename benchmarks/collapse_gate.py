"""The ``collapse`` regime's calibration gate, fixed before any experiment uses the regime.

Protocol: train ``dapo`` under the regime for ``STEPS`` RL steps from each of the calibration
seeds ``SEEDS`` (kept apart from the experiment's seeds 0-4). A seed collapses when its final
entropy (the mean token entropy of the rollouts over the last tenth of the steps, as the lab's
summary defines it) is below half its start entropy (step 1's): ``final / start < 0.5``. The gate
PASSES when every calibration seed collapses (2 of 2); otherwise the regime is not used, and that
is reported. Run from the repository root::

    python benchmarks/collapse_gate.py [--steps 100] [--seeds 100,101] [--cache-dir DIR]

It prints one line per seed (entropy ratio, greedy accuracy, pass@k, distinct right answers per
prompt at the start and the end, wall time) and then ``PASS`` or ``FAIL``; the exit status is 0
on PASS and 1 on FAIL.
"""

from __future__ import annotations

import argparse
import sys
import time

STEPS = 100
SEEDS = (100, 101)
OBJECTIVE = "dapo"
REGIME = "collapse"


def calibrate(seed: int, steps: int, cache_dir: str | None) -> dict:
    """One calibration run's numbers (the lab's summary of its rows, and the pass@k at its ends)."""
    import rlstab
    from rlstab.lab.regimes import load_regime
    from rlstab.lab.summary import COLLAPSE_RATIO, run_summary
    from rlstab.lazy import torch
    from rlstab.trainer.run import Run

    torch.set_num_threads(1)
    regime = load_regime(REGIME)
    started = time.perf_counter()
    run = Run(rlstab.load(OBJECTIVE), regime.train_config(steps=steps, seed=seed), regime.task, cache_dir=cache_dir)
    rows = [run.start()]
    while not run.done:
        rows.append(run.step().row)
    summary = run_summary(rows)
    ratio = summary["final_entropy"] / summary["start_entropy"]
    return {
        "seed": seed,
        "warm_start": run.policy.warm_start.facts,
        "start_entropy": summary["start_entropy"],
        "final_entropy": summary["final_entropy"],
        "ratio": ratio,
        "collapsed": ratio < COLLAPSE_RATIO,
        "accuracy": (summary["start_accuracy"], summary["final_accuracy"]),
        "pass_at_k": (rows[0].get("pass_at_k"), rows[-1].get("pass_at_k")),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: rlstab's)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    for seed in seeds:
        r = calibrate(seed, args.steps, args.cache_dir)
        results.append(r)
        (a0, a1), (p0, p1) = r["accuracy"], r["pass_at_k"]
        k = p0["k"] if p0 else 0
        passes = (f"pass@{k} {p0['pass_at_k']:.3f} -> {p1['pass_at_k']:.3f}, distinct right answers per prompt "
                  f"{p0['distinct_correct']:.2f} -> {p1['distinct_correct']:.2f}") if p0 and p1 else "no pass@k"
        print(f"seed {seed}: warm start {r['warm_start']}; entropy {r['start_entropy']:.3f} -> {r['final_entropy']:.3f} "
              f"(ratio {r['ratio']:.3f}, {'collapsed' if r['collapsed'] else 'not collapsed'}); accuracy "
              f"{a0:.3f} -> {a1:.3f}; {passes}; {r['seconds']:.0f} s", flush=True)
    collapsed = sum(r["collapsed"] for r in results)
    verdict = "PASS" if collapsed == len(results) else "FAIL"
    print(f"{verdict}: {collapsed} of {len(results)} {OBJECTIVE} calibration seeds end below half their start entropy "
          f"({REGIME} regime, {args.steps} steps; total {sum(r['seconds'] for r in results):.0f} s)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
