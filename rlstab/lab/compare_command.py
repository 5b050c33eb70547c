"""``rlstab compare``: the lab's command line (argparse only at import; the lab loads when it runs)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from rlstab.command_line import missing_plotting, positive


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="compare objectives over seeds and stress regimes with confidence intervals (resumable)",
        description=(
            "Train every objective under every regime from every seed on the embedded trainer, then write "
            "results.json, steps.json (every run's per-step metrics), report.md (means and 95% intervals over "
            "seeds; paired differences against each objective's baseline with raw and Holm-adjusted p-values and the "
            "minimum detectable effect), curves.png and differences.png to --out, with each run's metrics.jsonl under runs/. Rerunning the same "
            "command skips finished runs and resumes interrupted ones from their last checkpoint."
        ),
    )
    p.add_argument("--objective", action="append", required=True, metavar="PRESET|FILE",
                   help="a preset name or an objective YAML file; repeat for each objective")
    p.add_argument("--baseline", metavar="NAME", help="the objective the others are paired against (default: the first)")
    p.add_argument("--pair", action="append", default=[], metavar="OBJECTIVE=BASELINE",
                   help="pair this objective with this baseline instead, e.g. the one it extends (stapo=dapo); repeatable")
    p.add_argument("--protocol", metavar="FILE",
                   help="a YAML file with the pairing (baseline:, pairs: {OBJECTIVE: BASELINE}); --baseline and --pair add to it")
    p.add_argument("--seeds", type=positive, default=5, help="seeds 0..N-1 per objective and regime (default 5)")
    p.add_argument("--steps", type=positive, default=100, help="RL steps per run (default 100)")
    p.add_argument("--regime", action="append", metavar="NAME|FILE",
                   help="a shipped regime (default, entropy-collapse, policy-lag, sparse, small-lm) or a regime YAML file; "
                        "repeat for several (default: default)")
    p.add_argument("--task", default="add2", help="task of the regimes that do not fix one: add2 (default), add3, mul2, add1")
    p.add_argument("--model", default="tiny", help="tiny (default) or smollm2 (an optional extra)")
    p.add_argument("--workers", type=positive, default=None,
                   help=f"local worker processes, one run and one torch thread each (default: the cores, {os.cpu_count()})")
    p.add_argument("--ray-address", metavar="auto|HOST:PORT", help="send each run to this Ray cluster instead (needs rlstab[ray])")
    p.add_argument("--checkpoint-every", type=positive, default=10, help="steps between a run's checkpoints (default 10)")
    p.add_argument("--cache-dir", default=None, help="warm-start cache (default $XDG_CACHE_HOME/rlstab or ~/.cache/rlstab)")
    p.add_argument("--out", required=True, help="output folder (the same folder resumes a grid)")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from rlstab.errors import ConfigError, one_line
    from rlstab.lab.compare import LabError, compare

    missing = missing_plotting("rlstab compare")
    if missing:
        print(missing, file=sys.stderr)
        return 2

    from rlstab.lab.protocol import load_protocol, merged

    command = "rlstab " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] else None
    try:
        baseline, pair = merged(load_protocol(args.protocol) if args.protocol else None, args.baseline, args.pair)
        data = compare(
            args.objective, out=args.out, baseline=baseline, seeds=args.seeds, steps=args.steps,
            regimes=args.regime or ["default"], task=args.task, model=args.model, workers=args.workers,
            ray_address=args.ray_address, cache_dir=args.cache_dir, checkpoint_every=args.checkpoint_every,
            progress=not args.quiet, command=command, pair=pair,
        )
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    except (LabError, RuntimeError, OSError) as err:
        print(one_line(f"rlstab compare: {err}"), file=sys.stderr)
        return 2
    out = args.out
    written = ["results.json", "steps.json", "report.md", "curves.png"] + (["differences.png"] if data["settings"]["pairs"] else [])
    print(f"{len(data['runs'])} runs; wrote " + ", ".join(f"{out}/{name}" for name in written))
    return 0
