"""``rlstab demo``: RL-train a tiny policy with several objectives side by side and report.

Only argparse runs at import time; torch's model code, the trainer and matplotlib load when the
command runs, so ``rlstab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rlstab.command_line import load_inputs, missing_plotting, tiny_only, train_config
from rlstab.number_flags import CommandNumbers, check_numbers, number
from rlstab.path_flags import check_paths, folder

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
    number(p, "--steps", TrainConfig, default=d.steps, help="RL steps per objective")
    number(p, "--seed", TrainConfig, default=d.seed, help="seed of the warm start and of every objective's run")
    number(p, "--group-size", TrainConfig, default=d.group_size, help="responses per prompt, G")
    number(p, "--prompts-per-step", TrainConfig, default=d.prompts_per_step, help="prompts (groups) per RL step")
    number(p, "--micro-batch-size", TrainConfig, default=d.micro_batch_size, help="responses per micro-batch")
    number(p, "--updates-per-step", TrainConfig, default=d.updates_per_step,
           help="optimizer steps per rollout, each on a share of the groups")
    number(p, "--lr", TrainConfig, default=d.lr, help="Adam learning rate")
    number(p, "--temperature", TrainConfig, default=d.temperature, help="sampling temperature")
    number(p, "--max-grad-norm", TrainConfig, default=d.max_grad_norm, help="gradient clipping")
    number(p, "--warmup-steps", TrainConfig, optional="default per task: add2 130, add3 200, mul2 600",
           help="supervised warm-start steps, cached")
    number(p, "--eval-size", TrainConfig, default=d.eval_size, help="held-out problems for accuracy")
    number(p, "--eval-every", TrainConfig, default=d.eval_every,
           help="evaluate held-out accuracy every this many steps, and at the last")
    folder(p, "--out", default="runs/demo", help="output folder (default runs/demo)")
    folder(p, "--cache-dir", help="warm-start cache (default $XDG_CACHE_HOME/rlstab or ~/.cache/rlstab); tiny only")
    number(p, "--threads", CommandNumbers, default=1,
           help="torch CPU threads: at this model size a second thread mostly adds synchronisation")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """The ``rlstab demo`` command (torch runs on ``--threads`` threads meanwhile).

    Every flag (numbers, folders, the model and the flags smollm2 ignores), objective and the task are checked
    first, one line per problem, exit status 2; nothing is created before.
    """
    numbers_ok = check_numbers(args, "rlstab demo")
    paths_ok = check_paths(args, "rlstab demo")
    model_ok = tiny_only(args, "rlstab demo")
    inputs = load_inputs(args.objective or list(DEFAULT_OBJECTIVES), args.task, "rlstab demo", model=args.model)
    config = train_config(args, "rlstab demo") if numbers_ok else None
    if config is None or inputs is None or not (paths_ok and model_ok):
        return 2
    missing = missing_plotting("rlstab demo")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from rlstab.lazy import load

    torch = load()  # NumPy's warning filtered
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, inputs, config)
    finally:
        torch.set_num_threads(threads)


def _run(args, inputs, config) -> int:
    import copy

    from rlstab.demo import report
    from rlstab.trainer.models import load_policy
    from rlstab.trainer.run import Run

    loss_fns, labels, task = inputs
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(args.out)

    started = time.perf_counter()
    try:
        base = load_policy(args.model, task, seed=config.seed, cache_dir=args.cache_dir, progress=log,
                           warm_start_steps=config.warmup_steps)
    except (RuntimeError, ValueError) as err:
        print(f"rlstab demo: {err}", file=sys.stderr)
        return 2
    warm_time = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)  # once there is a model to train: a refused one leaves no folder

    writer = report.MetricsWriter(out)
    rows, wall_times = [], {}
    try:
        for label, loss_fn in zip(labels, loss_fns):
            run_started = time.perf_counter()
            run = Run(loss_fn, config, task, label=label, policy=copy.deepcopy(base))  # every objective: the same weights
            bar = None if args.quiet else report.ProgressBar(label, config.steps)
            rows.append(run.start())
            writer.write(rows[-1])
            accuracy, silenced = rows[-1]["accuracy"], 0.0
            while not run.done:
                row = run.step().row
                writer.write(row)
                rows.append(row)
                accuracy = row["accuracy"] if row["accuracy"] is not None else accuracy
                silenced += row["silenced"]
                if bar is not None:
                    bar.update(row["step"], report.progress_text(row, accuracy, silenced))
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
