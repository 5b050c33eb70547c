"""``rlstab demo``: RL-train a tiny policy with several objectives side by side and report.

Only argparse runs at import time; torch's model code, the trainer and matplotlib load when the
command runs, so ``rlstab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rlstab.command_line import load_inputs, missing_plotting, non_negative, positive, train_config

DEFAULT_OBJECTIVES = ("grpo", "stapo")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to the ``rlstab`` parser's subparsers."""
    from rlstab.trainer.config import TrainConfig

    d = TrainConfig()
    p = subparsers.add_parser(
        "demo",
        help="RL-train a tiny model on arithmetic with several objectives side by side (CPU, minutes)",
        description=(
            "Warm-start a ~0.8M-parameter character transformer on a synthetic arithmetic task (cached), then "
            "RL-train a fresh copy of it with each objective from the same seed, and write metrics.jsonl, "
            "curves.png and summary.md to --out."
        ),
    )
    p.add_argument("--objective", action="append", metavar="PRESET|FILE",
                   help=f"a preset name or an objective YAML file; repeat to compare (default: {' and '.join(DEFAULT_OBJECTIVES)})")
    p.add_argument("--task", default="add2", help="add2 (default), add3 or mul2 (harder: instability shows more), or add1 (direct answers, for --model smollm2)")
    p.add_argument("--model", default="tiny", help="tiny (default, trained in-process) or smollm2 (an optional extra)")
    p.add_argument("--steps", type=positive, default=d.steps, help=f"RL steps per objective (default {d.steps})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the warm start and of every objective's run (default {d.seed})")
    p.add_argument("--group-size", type=positive, default=d.group_size, help=f"responses per prompt, G (default {d.group_size})")
    p.add_argument("--prompts-per-step", type=positive, default=d.prompts_per_step,
                   help=f"prompts (groups) per RL step (default {d.prompts_per_step})")
    p.add_argument("--micro-batch-size", type=positive, default=d.micro_batch_size,
                   help=f"responses per micro-batch (default {d.micro_batch_size})")
    p.add_argument("--updates-per-step", type=positive, default=d.updates_per_step,
                   help=f"optimizer steps per rollout, each on a share of the groups (default {d.updates_per_step})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr:g})")
    p.add_argument("--temperature", type=float, default=d.temperature, help=f"sampling temperature (default {d.temperature:g})")
    p.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm, help=f"gradient clipping (default {d.max_grad_norm:g})")
    p.add_argument("--warmup-steps", type=non_negative, default=None,
                   help="supervised warm-start steps (default per task: add2 130, add3 200, mul2 600); cached")
    p.add_argument("--eval-size", type=positive, default=d.eval_size, help=f"held-out problems for accuracy (default {d.eval_size})")
    p.add_argument("--eval-every", type=positive, default=d.eval_every,
                   help=f"evaluate held-out accuracy every this many steps, and at the last (default {d.eval_every})")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--cache-dir", default=None, help="warm-start cache (default $XDG_CACHE_HOME/rlstab or ~/.cache/rlstab)")
    p.add_argument("--threads", type=positive, default=1,
                   help="torch CPU threads (default 1: at this model size a second thread mostly adds synchronisation)")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """The ``rlstab demo`` command (torch runs on ``--threads`` threads meanwhile)."""
    missing = missing_plotting("rlstab demo")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from rlstab.lazy import load

    torch = load()  # NumPy's warning filtered
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args) -> int:
    import copy

    from rlstab.demo import report
    from rlstab.trainer.models import load_policy
    from rlstab.trainer.run import Run

    sources = args.objective or list(DEFAULT_OBJECTIVES)
    inputs = load_inputs(sources, args.task, "rlstab demo")
    if inputs is None:
        return 2
    loss_fns, labels, task = inputs
    config = train_config(args, "rlstab demo")
    if config is None:
        return 2
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    try:
        base = load_policy(args.model, task, seed=config.seed, cache_dir=args.cache_dir, progress=log,
                           warm_start_steps=config.warmup_steps)
    except (RuntimeError, ValueError) as err:
        print(f"rlstab demo: {err}", file=sys.stderr)
        return 2
    warm_time = time.perf_counter() - started

    writer = report.MetricsWriter(out)
    rows, wall_times = [], {}
    try:
        for label, loss_fn in zip(labels, loss_fns):
            run_started = time.perf_counter()
            run = Run(loss_fn, config, task, label=label, policy=copy.deepcopy(base))  # every objective: the same weights
            bar = None if args.quiet else report.ProgressBar(label, config.steps)
            rows.append(run.start())
            writer.write(rows[-1])
            accuracy = rows[-1]["accuracy"]
            while not run.done:
                row = run.step().row
                writer.write(row)
                rows.append(row)
                accuracy = row["accuracy"] if row["accuracy"] is not None else accuracy
                if bar is not None:
                    bar.update(row["step"], f"reward {row['reward']:.2f}  held-out acc {accuracy:.2f}  "
                                            f"entropy {row['entropy']:.3f}  silenced {int(row['silenced'])}")
            wall_times[label] = time.perf_counter() - run_started
    finally:
        writer.close()
    eval_problems = run.eval_problems

    total = time.perf_counter() - started
    warm = getattr(base, "warm_start", None)
    header = [
        f"- task: {task.name} ({task.description}); model: {args.model}; seed {config.seed}",
        f"- {config.steps} RL steps x {config.prompts_per_step} prompts x {config.group_size} samples, "
        f"{config.updates_per_step} optimizer update(s) per step, micro-batches of {config.micro_batch_size}, "
        f"lr {config.lr:g}, temperature {config.temperature:g}, grad clip {config.max_grad_norm:g}",
        f"- held-out set: {len(eval_problems)} problems, evaluated every {config.eval_every} steps",
        f"- warm start: {('loaded from cache' if warm.cache_hit else 'trained') if warm else 'none (pretrained)'} "
        f"({warm_time:.1f} s to load the model); total wall time {total:.1f} s",
    ]
    title = f"rlstab demo: {task.name}, {args.model} model, seed {config.seed}"
    curves = report.write_curves(rows, out / report.CURVES_FILE, title)
    summary = report.write_summary(rows, wall_times, out / report.SUMMARY_FILE, header)
    print(report.summary_table(rows, wall_times))
    if len(labels) > 1:
        print(f"\n{report.ONE_SEED_NOTE}")
    print(f"\nwrote {out / 'metrics.jsonl'}, {curves}, {summary} in {total:.1f} s")
    return 0
