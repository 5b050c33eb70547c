"""``rlstab audit``: which tokens would each mask silence, on a real policy's own responses?

Only argparse runs at import time; torch, the models and matplotlib load when the command runs,
so ``rlstab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rlstab.command_line import MODEL_NAMES, load_inputs, missing_plotting, tiny_only
from rlstab.demo import counterfactual_command
from rlstab.number_flags import CommandNumbers, check_numbers, number
from rlstab.path_flags import check_paths, folder

TABLE_FILE = "audit.md"
CHART_FILE = "audit.png"
DATA_FILE = "audit.json"
# Problems sampled by default: tens of thousands of tokens for the tiny model (seconds), fewer for
# SmolLM2 (about two minutes on two cores).
DEFAULT_PROMPTS = {"tiny": 256, "smollm2": 32}
DEFAULT_TEMPERATURE = 1.0
"""STAPO's sampling temperature (arXiv 2602.15620); ``--mechanism --from`` samples at each run's own instead."""


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``audit`` subcommand to the ``rlstab`` parser's subparsers."""
    from rlstab.trainer.config import TrainConfig

    p = subparsers.add_parser(
        "audit",
        help="sample a policy's responses and show which tokens each mask of an objective would silence",
        description=(
            "Sample --group-size responses to each of --prompts problems of --task from --model, compute every "
            "token's probability, entropy and advantage, and report, for each mask of each objective, how many "
            "tokens it silences and which ones (STAPO's analysis of spurious tokens). Writes audit.md, audit.png "
            "and audit.json to --out and prints the table. With --counterfactual, apply one optimizer update each way "
            "from saved states (--from a lab run's checkpoints, or --model as loaded) and rank the mask's effect within "
            "count-matched random nulls: writes audit.md and counterfactual.json."
        ),
    )
    p.add_argument("--objective", action="append", metavar="PRESET|FILE",
                   help="a preset name or an objective YAML file; repeat to compare "
                        "(default: stapo, stapo-probability-only and stapo-high-entropy)")
    p.add_argument("--model", choices=MODEL_NAMES,
                   help="tiny (default: the demo's character transformer, warm-started and cached) or smollm2 "
                        "(SmolLM2-135M-Instruct, an optional extra); with --from, the runs' own")
    p.add_argument("--task", help="add2 (default), add3, mul2 or add1 (direct answers, for --model smollm2); "
                                  "with --from, the runs' own")
    number(p, "--prompts", CommandNumbers,
           optional=f"default {DEFAULT_PROMPTS['tiny']} for tiny, {DEFAULT_PROMPTS['smollm2']} for smollm2",
           help="problems to sample: STAPO's spurious tokens are about 1 in 10,000")
    number(p, "--group-size", TrainConfig, default=8, help="responses per problem, G")
    number(p, "--seed", TrainConfig, default=0, help="seed of the problems, the sampling and the tiny model's warm start")
    number(p, "--temperature", TrainConfig, optional=f"default {DEFAULT_TEMPERATURE:g}; --mechanism --from: each "
                                                     "run's regime temperature",
           help="sampling temperature (1.0 as STAPO)")
    number(p, "--top-k", CommandNumbers, optional="default 8", help="most silenced tokens shown per mask")
    number(p, "--warmup-steps", TrainConfig, optional="default: per task, as rlstab demo",
           help="tiny model: supervised warm-start steps, cached")
    folder(p, "--out", default="runs/audit", help="output folder (default runs/audit)")
    folder(p, "--cache-dir", help="warm-start cache (default $XDG_CACHE_HOME/rlstab or ~/.cache/rlstab); tiny only")
    number(p, "--threads", CommandNumbers, optional="default: 1 for tiny, where more cost more than they save; all for smollm2",
           help="torch CPU threads")
    p.add_argument("--mechanism", action="store_true",
                   help="also measure STAPO's mechanism on the sample as one step: the share of the policy gradient "
                        "carried by the tokens each mask silences, and the logit-gradient norm by probability and "
                        "entropy (a backward pass per mask; see docs/audit.md); with --from, instead, along training: "
                        "on each saved state's own batch, the mask's share ranked within --null-draws count-matched "
                        "random and p-matched sets, and the correlation with entropy at fixed probability")
    counterfactual_command.add_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """The ``rlstab audit`` command (torch runs on ``--threads`` threads meanwhile).

    Every flag (numbers, folders, the flags smollm2 ignores), objective and the task are checked first, one
    line per problem, exit status 2: a bad ``--out`` is refused before the audit runs, not after.
    """
    from rlstab.demo.audit import DEFAULT_OBJECTIVES

    numbers_ok = check_numbers(args, "rlstab audit")
    paths_ok = check_paths(args, "rlstab audit")
    model_ok = tiny_only(args, "rlstab audit")
    flags_ok = counterfactual_command.flags_ok(args)
    if args.mechanism and args.sources and not args.counterfactual:  # the mechanism along training
        from rlstab.demo import mechanism_along_command

        return mechanism_along_command.run(args, numbers_ok and paths_ok and model_ok and flags_ok)
    if args.temperature is None:
        args.temperature = DEFAULT_TEMPERATURE
    if args.counterfactual:
        return counterfactual_command.run(args, numbers_ok and paths_ok and model_ok and flags_ok)
    args.model, args.task, args.top_k = args.model or "tiny", args.task or "add2", args.top_k or 8
    sources = args.objective or list(DEFAULT_OBJECTIVES)
    inputs = load_inputs(sources, args.task, "rlstab audit")
    if not (numbers_ok and paths_ok and model_ok and flags_ok) or inputs is None or not _estimated_advantages(sources, inputs[0]):
        return 2
    missing = missing_plotting("rlstab audit")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from rlstab.lazy import load

    torch = load()  # NumPy's warning filtered
    threads = torch.get_num_threads()
    wanted = args.threads or (1 if args.model == "tiny" else threads)
    torch.set_num_threads(wanted)
    try:
        return _run(args, inputs)
    finally:
        torch.set_num_threads(threads)


def _estimated_advantages(sources: list[str], loss_fns: list) -> bool:
    """False after one line per objective whose advantages the trainer gives (the audit estimates them)."""
    from rlstab.advantages import Given
    from rlstab.errors import one_line

    ok = True
    for source, fn in zip(sources, loss_fns):
        if isinstance(fn.objective.advantage, Given):
            print(one_line(f"rlstab audit: {source}: its advantages are given by the trainer (advantage: given); the "
                           "audit estimates them from rewards, so the objective needs an advantage estimator"), file=sys.stderr)
            ok = False
    return ok


def _run(args, inputs) -> int:
    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    loss_fns, labels, task = inputs
    from rlstab.trainer.models import load_policy

    started = time.perf_counter()
    try:
        policy = load_policy(args.model, task, seed=args.seed, cache_dir=args.cache_dir, progress=log,
                             warm_start_steps=args.warmup_steps)
    except (ImportError, RuntimeError) as err:
        print(f"rlstab audit: {err}", file=sys.stderr)
        return 2
    prompts = args.prompts or DEFAULT_PROMPTS[args.model]
    log(f"audit: sampling {prompts} x {args.group_size} responses ({args.model} on {task.name})")
    report = audit(policy, task, loss_fns, labels, model=args.model, prompts=prompts,
                   group_size=args.group_size, seed=args.seed, temperature=args.temperature, top_k=args.top_k,
                   mechanism=args.mechanism, log=log)
    out = Path(args.out)
    write(report, out)
    print(report["markdown"])
    log(f"audit: wrote {out / TABLE_FILE}, {out / CHART_FILE} and {out / DATA_FILE} "
        f"in {time.perf_counter() - started:.0f} s")
    return 0


def audit(policy, task, loss_fns, labels, *, model, prompts, group_size, seed, temperature, top_k,
          mechanism: bool = False, log=None) -> dict:
    """Sample, audit every objective, and lay out the report (no file I/O); ``mechanism``: add :func:`audit_mechanism`'s."""
    from rlstab.demo.audit import audit_mechanism, audit_objective, collect
    from rlstab.demo.audit_report import (
        examples_table,
        markdown_table,
        mechanism_section,
        rules,
        summary_line,
    )

    sample = collect(policy, task, prompts=prompts, group_size=group_size, seed=seed, temperature=temperature,
                     model=model)
    audits = [audit_objective(sample, fn, name=label, top_k=top_k) for fn, label in zip(loss_fns, labels)]
    if mechanism:
        for a, fn in zip(audits, loss_fns):
            started = time.perf_counter()
            a.mechanism = audit_mechanism(sample, policy, fn)
            if log is not None:
                log(f"audit: mechanism of {a.name} in {time.perf_counter() - started:.1f} s")
    parts = [f"# Token audit: {model} on {task.name}", summary_line(sample), markdown_table(audits)]
    examples = examples_table(audits)
    if examples:
        parts.append("Silenced tokens in their responses (the first few per mask):\n\n" + examples)
    parts.append("Masks:\n\n" + "\n".join(f"- {r}" for r in rules(audits)))
    parts.append(f"![most silenced tokens per mask]({CHART_FILE})")
    section = mechanism_section(audits)
    if section:
        parts.append(section)
    return {
        "sample": sample,
        "audits": audits,
        "markdown": "\n\n".join(parts[:3]),  # what the command prints
        "document": "\n\n".join(parts) + "\n",  # audit.md
    }


def write(report: dict, out: Path) -> None:
    """``audit.md``, ``audit.png`` and ``audit.json`` under ``out``."""
    from rlstab.demo.audit_report import figure

    sample, audits = report["sample"], report["audits"]
    out.mkdir(parents=True, exist_ok=True)
    (out / TABLE_FILE).write_text(report["document"])
    fig = figure(audits, title=f"Most silenced tokens: {sample.model} on {sample.task}, "
                               f"{sample.responses} responses, {sample.tokens:,} tokens")
    fig.savefig(out / CHART_FILE, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    data = {
        "model": sample.model,
        "task": sample.task,
        "responses": sample.responses,
        "prompts": len(sample.problems),
        "group_size": sample.group_size,
        "temperature": sample.temperature,
        "seed": sample.seed,
        "tokens": sample.tokens,
        "mean_reward": float(sample.rewards.mean()) if sample.responses else 0.0,
        "mixed_groups": sample.mixed_groups,
        "objectives": [
            {
                "name": a.name,
                "advantage": a.advantage,
                "positive_tokens": a.positive_tokens,
                "kept": a.kept,
                "metrics": a.metrics,
                **({} if a.mechanism is None else {"mechanism": a.mechanism}),
                "masks": [
                    {
                        "label": m.label,
                        "rule": m.rule,
                        "tokens": m.tokens,
                        "silenced": m.silenced,
                        "fraction": m.fraction,
                        "threshold": m.threshold,
                        "top": [vars(c) for c in m.top],
                        "silenced_if_rewarded": m.silenced_if_rewarded,
                        "top_if_rewarded": [vars(c) for c in m.top_if_rewarded],
                        "examples": [vars(e) for e in m.examples],
                    }
                    for m in a.masks
                ],
            }
            for a in audits
        ],
    }
    (out / DATA_FILE).write_text(json.dumps(data, indent=2) + "\n")
