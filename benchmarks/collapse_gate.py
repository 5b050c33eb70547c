"""A regime's calibration gate, fixed before any experiment uses the regime: does it collapse, and do the masks fire?

Protocol: train an objective (``dapo`` by default) under the regime for ``--steps`` RL steps from each
of the calibration seeds ``--seeds`` (kept apart from the experiments' seeds 0, 1, ...). A seed
collapses when its final entropy (the mean token entropy of the rollouts over the last tenth of the
steps, as the lab's summary defines it) is below half its start entropy (step 1's):
``final / start < 0.5``. With ``--fires LABEL`` (repeatable; a mask of the objective, ``s2t``, or a
shadow mask, ``shadow/s2t_2``), a mask *fires* on a step when it silences at least ``--at-least`` of
the step's valid tokens (default 0.0001, 0.01%), and it passes when it fires on at least
``--on-share`` of the calibration runs' steps, pooled (default 0.2). The gate PASSES when every
calibration seed collapses and every named mask passes; otherwise the regime is not used as
planned, and that is reported. Run from the repository root::

    python benchmarks/collapse_gate.py [--regime collapse] [--objective dapo] [--model tiny] \\
        [--fires LABEL ...] [--at-least 0.0001] [--on-share 0.2] [--steps 100] [--seeds 100,101] \\
        [--cache-dir DIR] [--json FILE]

It prints one line per seed (entropy ratio, greedy accuracy, pass@k and distinct right answers per
prompt at the start and the end where the regime measures them, how often each named mask fired,
wall time), one line per named mask, and then ``PASS`` or ``FAIL``; the exit status is 0 on PASS and
1 on FAIL. ``--json FILE`` also writes the settings, every seed's rows and the verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

STEPS = 100
SEEDS = (100, 101)
OBJECTIVE = "dapo"
REGIME = "collapse"
AT_LEAST = 1e-4
ON_SHARE = 0.2


def silenced_fraction(row: dict, label: str) -> float:
    """The share of the step's valid tokens that mask ``label`` silenced (a shadow mask: would have silenced)."""
    valid = row["loss"]["tokens/valid"]
    masks = row.get("masks", {})
    silenced = masks[label]["silenced"] if label in masks else row["loss"][f"{label}/silenced"]
    return silenced / valid if valid else 0.0


def fired_steps(rows: Sequence[dict], label: str, at_least: float = AT_LEAST) -> int:
    """The RL steps of ``rows`` on which mask ``label`` silenced at least ``at_least`` of the valid tokens."""
    return sum(silenced_fraction(r, label) >= at_least for r in rows if r["step"] > 0)


def calibrate(seed: int, steps: int, *, regime_name: str, objective: str, model: str, cache_dir: str | None) -> dict:
    """One calibration run: its rows and the lab's summary numbers of them."""
    import rlstab
    from rlstab.lab.regimes import load_regime
    from rlstab.lab.summary import COLLAPSE_RATIO, run_summary
    from rlstab.lazy import torch
    from rlstab.trainer.run import Run

    torch.set_num_threads(1)
    regime = load_regime(regime_name)
    started = time.perf_counter()
    run = Run(rlstab.load(objective), regime.train_config(steps=steps, seed=seed), regime.task or "add2", model=model,
              cache_dir=cache_dir)
    rows = [run.start()]
    while not run.done:
        rows.append(run.step().row)
    summary = run_summary(rows)
    ratio = summary["final_entropy"] / summary["start_entropy"]
    return {
        "seed": seed,
        "warm_start": getattr(getattr(run.policy, "warm_start", None), "facts", {}),
        "start_entropy": summary["start_entropy"],
        "final_entropy": summary["final_entropy"],
        "ratio": ratio,
        "collapsed": ratio < COLLAPSE_RATIO,
        "accuracy": (summary["start_accuracy"], summary["final_accuracy"]),
        "pass_at_k": (rows[0].get("pass_at_k"), rows[-1].get("pass_at_k")),
        "seconds": time.perf_counter() - started,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", default=REGIME, help=f"a shipped regime or a regime YAML file (default: {REGIME})")
    parser.add_argument("--objective", default=OBJECTIVE, help=f"a preset or an objective YAML file (default: {OBJECTIVE})")
    parser.add_argument("--model", default="tiny", help="tiny (default) or smollm2")
    parser.add_argument("--fires", action="append", default=[], metavar="LABEL",
                        help="a mask that must fire (s2t, shadow/s2t_2, ...); repeatable")
    parser.add_argument("--at-least", type=float, default=AT_LEAST, help="share of a step's valid tokens (default 0.0001)")
    parser.add_argument("--on-share", type=float, default=ON_SHARE, help="share of the steps, pooled (default 0.2)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--cache-dir", default=None, help="warm-start cache (default: rlstab's)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the settings, rows and verdict here")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    for seed in seeds:
        r = calibrate(seed, args.steps, regime_name=args.regime, objective=args.objective, model=args.model,
                      cache_dir=args.cache_dir)
        results.append(r)
        (a0, a1), (p0, p1) = r["accuracy"], r["pass_at_k"]
        k = p0["k"] if p0 else 0
        passes = (f"pass@{k} {p0['pass_at_k']:.3f} -> {p1['pass_at_k']:.3f}, distinct right answers per prompt "
                  f"{p0['distinct_correct']:.2f} -> {p1['distinct_correct']:.2f}") if p0 and p1 else "no pass@k"
        fires = "".join(f"; {label} fired on {fired_steps(r['rows'], label, args.at_least)} of {args.steps} steps"
                        for label in args.fires)
        print(f"seed {seed}: warm start {r['warm_start']}; entropy {r['start_entropy']:.3f} -> {r['final_entropy']:.3f} "
              f"(ratio {r['ratio']:.3f}, {'collapsed' if r['collapsed'] else 'not collapsed'}); accuracy "
              f"{a0:.3f} -> {a1:.3f}; {passes}{fires}; {r['seconds']:.0f} s", flush=True)
    collapsed = sum(r["collapsed"] for r in results)
    total = args.steps * len(results)
    fired = {label: sum(fired_steps(r["rows"], label, args.at_least) for r in results) for label in args.fires}
    for label, n in fired.items():
        print(f"{label}: silenced at least {100 * args.at_least:g}% of the valid tokens on {n} of {total} steps "
              f"({'at least' if n >= args.on_share * total else 'under'} {100 * args.on_share:g}%)")
    ok = collapsed == len(results) and all(n >= args.on_share * total for n in fired.values())
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}: {collapsed} of {len(results)} {args.objective} calibration seeds end below half their start entropy"
          + "".join(f"; {label} fired on {n} of {total} steps" for label, n in fired.items())
          + f" ({args.regime} regime, {args.steps} steps; total {sum(r['seconds'] for r in results):.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(args).items() if k not in ("json", "cache_dir")}, "verdict": verdict,
                       "fired": fired, "runs": results}, f, indent=1)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
