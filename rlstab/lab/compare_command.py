"""``rlstab compare``: the lab's command line (argparse only at import; the lab loads when it runs)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

from pydantic import BaseModel, Field

from rlstab.command_line import installed, missing_plotting, tiny_only
from rlstab.lab.compare import MAX_RUNS
from rlstab.lab.regimes import regime_names
from rlstab.number_flags import CommandNumbers, check_numbers, number
from rlstab.path_flags import check_paths, folder
from rlstab.trainer.config import TrainConfig

MAX_SHOWN = 10
"""Problems printed before "... and N more" (a grid can have thousands of mismatched run folders)."""
RAY_ADDRESS = re.compile(r"auto|local|ray://\S+|[^\s/]+:\d{1,5}")
"""What ``ray.init(address=...)`` takes: ``auto``, ``local``, ``HOST:PORT`` (the cluster's GCS), ``ray://HOST:PORT``."""


class GridNumbers(BaseModel):
    """``compare``'s own count: seeds per objective and regime."""

    seeds: int = Field(5, ge=1, le=MAX_RUNS)
    """Seeds 0..N-1 (and the whole grid, objectives x regimes x seeds, is at most ``MAX_RUNS`` runs)."""


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare",
        help="compare objectives over seeds and stress regimes with confidence intervals (resumable)",
        description=(
            "Train every objective under every regime from every seed on the embedded trainer, then write "
            "results.json, steps.json (every run's per-step metrics), report.md (means and 95% intervals over "
            "seeds; paired differences against each objective's baseline with raw and Holm-adjusted p-values, the "
            "effective n and the minimum detectable effect under Holm; the protocol's gates and trend test), "
            "curves.png and differences.png to --out, with each run's metrics.jsonl under runs/. Rerunning the same "
            "command skips finished runs and resumes interrupted ones from their last checkpoint."
        ),
    )
    p.add_argument("--objective", action="append", required=True, metavar="PRESET|FILE",
                   help="a preset name or an objective YAML file; repeat for each objective")
    p.add_argument("--baseline", metavar="NAME", help="the objective the others are paired against (default: the first)")
    p.add_argument("--pair", action="append", default=[], metavar="OBJECTIVE=BASELINE",
                   help="pair this objective with this baseline instead, e.g. the one it extends (stapo=dapo); repeatable")
    p.add_argument("--protocol", metavar="FILE",
                   help="a YAML file written before the runs: the pairing (baseline:, pairs: {OBJECTIVE: BASELINE}), the "
                        "firing gates (gates: {ARM: {mask, at_least, on_share_of_steps}}, fallback:), the primary metrics "
                        "(primary: [...]) and a dose-trend test (trend: {arms, doses, metric}); --baseline and --pair add to it")
    number(p, "--seeds", GridNumbers, default=5,
           help=f"seeds 0..N-1 per objective and regime; the grid holds at most {MAX_RUNS:,} runs")
    number(p, "--steps", TrainConfig, default=100, help="RL steps per run")
    p.add_argument("--regime", action="append", metavar="NAME|FILE",
                   help=f"a shipped regime ({', '.join(regime_names())}) or a regime YAML file; "
                        "repeat for several (default: default)")
    p.add_argument("--task", default="add2", help="task of the regimes that do not fix one: add2 (default), add3, mul2, add1")
    p.add_argument("--model", default="tiny", help="tiny (default) or smollm2 (an optional extra)")
    number(p, "--workers", CommandNumbers, optional=f"default: the cores, {os.cpu_count()}",
           help="local worker processes, one run and one torch thread each")
    p.add_argument("--ray-address", metavar="auto|HOST:PORT",
                   help="send each run to this Ray cluster instead, as a task asking for one CPU (needs rlstab[ray]; "
                        "not with --workers)")
    number(p, "--checkpoint-every", CommandNumbers, default=10, help="steps between a run's checkpoints")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep every checkpoint of the runs it trains as runs/.../checkpoints/stepNNNNNN.pt, also after "
                        "they finish: the saved states of rlstab audit --counterfactual --from")
    folder(p, "--cache-dir", help="warm-start cache (default $XDG_CACHE_HOME/rlstab or ~/.cache/rlstab); tiny only; "
                                  "with --ray-address, a folder of the workers', not checked here")
    folder(p, "--out", required=True, help="output folder (the same folder resumes a grid)")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """The ``rlstab compare`` command: every flag and input checked first, one line per problem, exit status 2;
    nothing is created before."""
    from rlstab.errors import ConfigError
    from rlstab.lab.compare import InputErrors, LabError, check_inputs, compare

    numbers_ok = check_numbers(args, "rlstab compare")
    paths_ok = check_paths(args, "rlstab compare", skip=("cache_dir",) if args.ray_address else ())
    model_ok = tiny_only(args, "rlstab compare")
    ray_ok = _ray_flags_ok(args)
    if not (numbers_ok and paths_ok and model_ok and ray_ok):
        # A flag is bad; the objectives, regimes and pairing are still checked, so that every problem shows.
        try:
            _report(check_inputs(args.objective, **_inputs(args)))
        except (ConfigError, LabError, OSError) as err:
            _report([err])
        return 2
    missing = missing_plotting("rlstab compare")
    if missing:
        print(missing, file=sys.stderr)
        return 2

    command = "rlstab " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] else None
    try:
        data = compare(
            args.objective, out=args.out, seeds=args.seeds, steps=args.steps, workers=args.workers,
            ray_address=args.ray_address, cache_dir=args.cache_dir, checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            progress=not args.quiet, command=command, **_inputs(args),
        )
    except InputErrors as err:
        _report(err.errors)
        return 2
    except (ConfigError, LabError, RuntimeError, OSError) as err:
        _report([err])
        return 2
    out = args.out
    written = ["results.json", "steps.json", "report.md", "curves.png"] + (["differences.png"] if data["settings"]["pairs"] else [])
    runs = len(data["runs"])
    print(f"{runs} run{'' if runs == 1 else 's'}; wrote " + ", ".join(f"{out}/{name}" for name in written))
    return 0


def _ray_flags_ok(args) -> bool:
    """False after one line per problem of ``--ray-address``: its form, Ray not installed, ``--workers`` with it.

    With Ray each run is a Ray task asking for one CPU, and the cluster decides how many run at once:
    ``--workers`` (local processes) would be ignored.
    """
    address = args.ray_address
    if address is None:
        return True
    problems = []
    if not RAY_ADDRESS.fullmatch(address):
        problems.append(f"--ray-address {shlex.quote(address)}: must be auto, local, HOST:PORT or ray://HOST:PORT")
    if not installed("ray"):
        problems.append("--ray-address needs Ray, which is not installed: pip install 'rlstab[ray]'")
    if args.workers is not None:
        problems.append(f"--workers {args.workers} and --ray-address {shlex.quote(address)}: with Ray each run is a "
                        "task asking for one CPU and the cluster sets how many run at once; give one of the two")
    _report([ValueError(problem) for problem in problems])
    return not problems


def _inputs(args) -> dict:
    """``compare``'s keyword arguments that are not numbers, the protocol file read (``compare`` merges its pairing)."""
    from rlstab.lab.protocol import load_protocol

    return {"baseline": args.baseline, "pair": args.pair, "protocol": load_protocol(args.protocol) if args.protocol else None,
            "regimes": args.regime or ["default"], "task": args.task, "model": args.model}


def _report(errors: list[Exception]) -> None:
    """One line per problem on stderr (a ConfigError's lines as they are), at most ``MAX_SHOWN``."""
    from rlstab.errors import ConfigError, one_line

    lines = [line for err in errors
             for line in (str(err).splitlines() if isinstance(err, ConfigError) else [one_line(f"rlstab compare: {err}")])]
    for line in lines[:MAX_SHOWN]:
        print(line, file=sys.stderr)
    if len(lines) > MAX_SHOWN:
        print(f"rlstab compare: ... and {len(lines) - MAX_SHOWN} more problems", file=sys.stderr)
