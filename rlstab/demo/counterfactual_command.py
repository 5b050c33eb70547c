"""``rlstab audit --counterfactual``: its flags, their checks and the run (``rlstab.demo.counterfactual`` computes).

Only argparse and pydantic at import time: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from rlstab.errors import one_line
from rlstab.number_flags import number

COMMAND = "rlstab audit"
DATA_FILE = "counterfactual.json"
TABLE_FILE = "audit.md"
DEFAULT_PROMPTS = {"tiny": 64, "smollm2": 16}
"""Problems of the update's batch by default (x ``--group-size`` responses). On this project's busy two-core machine
an update and its measures took 2 to 4 s for the tiny model's 512 responses, 1 to 2 minutes for SmolLM2's 128."""
DEFAULT_HELD_OUT = {"tiny": 256, "smollm2": 16}
"""Held-out problems by default: the trainer's own held-out set for the tiny model (``TrainConfig.eval_size``); a few
for SmolLM2, whose greedy evaluation after every update is most of an arm's cost."""
ONLY_HERE = ("sources", "states", "null_draws", "held_out", "lr")
"""The dests of the flags that apply to ``--counterfactual`` (the first three to ``--mechanism --from`` too)."""
ALONG = ("sources", "states", "null_draws")
"""The dests of the flags that also apply to ``--mechanism`` (the mechanism along training, ``--from`` saved states)."""
NOT_HERE = ("top_k", "mechanism")
"""The dests of the token audit's flags that ``--counterfactual`` does not use."""


class CounterfactualNumbers(BaseModel):
    """``rlstab audit --counterfactual``'s own numbers."""

    null_draws: int = Field(50, ge=50, le=10_000)
    """Count-matched random sets per state, K: at least 50 (issue 39), so the smallest p is 1/51 < 0.02."""
    held_out: int = Field(256, ge=1, le=4096)
    """Held-out problems for the entropy, KL and reward measures."""


def add_flags(p: argparse.ArgumentParser) -> None:
    """``--counterfactual`` and the flags that apply to it only."""
    from rlstab.trainer.config import TrainConfig

    p.add_argument("--counterfactual", action="store_true",
                   help="instead of the token audit, apply one optimizer update from each saved state with all tokens, "
                        "with the mask's tokens silenced, with --null-draws count-matched random sets of positive-"
                        "advantage tokens and with the as many lowest-probability ones, and rank the mask's effect on "
                        "entropy, KL, Adam's update and held-out reward within its null (see docs/audit.md)")
    p.add_argument("--from", dest="sources", action="append", metavar="DIR",
                   help="--counterfactual or --mechanism: a lab run's folder (runs/REGIME/OBJECTIVE/seedN of rlstab "
                        "compare --keep-checkpoints) whose checkpoints are the states; repeat for several runs "
                        "(default: --model as loaded, with a fresh Adam; --mechanism: one sample of --model)")
    p.add_argument("--states", metavar="STEP,...",
                   help="--counterfactual or --mechanism, with --from: the checkpoints' steps to audit, e.g. 5,10,20 "
                        "(default: all)")
    number(p, "--null-draws", CounterfactualNumbers, optional="default 50",
           help="--counterfactual, or --mechanism with --from: count-matched random sets per state (and per null), K")
    number(p, "--held-out", CounterfactualNumbers,
           optional=f"default {DEFAULT_HELD_OUT['tiny']} for tiny, {DEFAULT_HELD_OUT['smollm2']} for smollm2",
           help="--counterfactual: held-out problems for the entropy, KL and reward measures")
    number(p, "--lr", TrainConfig, optional=f"default {TrainConfig.model_fields['lr'].default:g}",
           help="--counterfactual without --from: Adam's learning rate (with --from, each checkpoint's own)")


def flags_ok(args) -> bool:
    """False after one line per flag given where it does not apply: a counterfactual flag without
    ``--counterfactual`` (``--from``, ``--states`` and ``--null-draws`` apply to ``--mechanism`` too), a token-audit
    flag with it or with ``--mechanism --from``."""
    ok = True
    if not args.counterfactual:
        for dest in ONLY_HERE:
            if getattr(args, dest) is None or (args.mechanism and dest in ALONG):
                continue
            where = "--counterfactual or --mechanism" if dest in ALONG else "--counterfactual"
            print(f"{COMMAND}: {_flag(dest)} applies to {where} only; leave it out", file=sys.stderr)
            ok = False
        if args.mechanism:
            ok = _mechanism_flags_ok(args) and ok
        return ok
    for dest in NOT_HERE:
        if getattr(args, dest) not in (None, False):
            print(f"{COMMAND}: {_flag(dest)} applies to the token audit, not to --counterfactual; leave it out",
                  file=sys.stderr)
            ok = False
    if args.objective and len(args.objective) > 1:
        print(f"{COMMAND}: --counterfactual audits one objective's mask; give --objective once "
              f"(got {len(args.objective)})", file=sys.stderr)
        ok = False
    if args.sources:
        for dest in ("warmup_steps", "cache_dir", "lr"):
            if getattr(args, dest) is not None:
                print(f"{COMMAND}: {_flag(dest)} does not apply with --from (the states are the run's checkpoints); "
                      "leave it out", file=sys.stderr)
                ok = False
    return _states_need_from(args) and ok


def _mechanism_flags_ok(args) -> bool:
    """``--mechanism``'s: without ``--from``, ``--states`` and ``--null-draws`` (the one-sample audit draws no null);
    with it, one ``--objective`` and none of the token audit's or the warm start's flags."""
    ok = True
    if not args.sources:
        ok = _states_need_from(args)
        if args.null_draws is not None:
            print(f"{COMMAND}: --null-draws needs --from with --mechanism (the one-sample --mechanism draws no null)",
                  file=sys.stderr)
            ok = False
        return ok
    if args.top_k is not None:
        print(f"{COMMAND}: --top-k applies to the token audit, not to --mechanism --from; leave it out", file=sys.stderr)
        ok = False
    if args.objective and len(args.objective) > 1:
        print(f"{COMMAND}: --mechanism --from audits one objective's mask; give --objective once "
              f"(got {len(args.objective)})", file=sys.stderr)
        ok = False
    for dest in ("warmup_steps", "cache_dir"):
        if getattr(args, dest) is not None:
            print(f"{COMMAND}: {_flag(dest)} does not apply with --from (the states are the run's checkpoints); "
                  "leave it out", file=sys.stderr)
            ok = False
    return ok


def write_outputs(args, data: dict, document, printed, data_file: str, *, started: float, log) -> int:
    """A saved-state audit's outputs, ``data`` with the command line that made it: as ``data_file`` and as
    ``document(data)`` (``audit.md``) in ``--out``, ``printed(data)`` on stdout; exit status 0."""
    data = {"command": "rlstab " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["audit"] else None,
            **data}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / TABLE_FILE).write_text(document(data))
    (out / data_file).write_text(json.dumps(data, indent=1) + "\n")
    print(printed(data))
    log(f"audit: wrote {out / TABLE_FILE} and {out / data_file} in {time.perf_counter() - started:.0f} s")
    return 0


def _states_need_from(args) -> bool:
    """False after its line when ``--states`` is given without ``--from``."""
    if args.sources or args.states is None:
        return True
    print(f"{COMMAND}: --states {shlex.quote(args.states)} needs --from (the steps of a lab run's checkpoints)",
          file=sys.stderr)
    return False


def _flag(dest: str) -> str:
    return "--from" if dest == "sources" else "--" + dest.replace("_", "-")


def parse_states(text: str | None) -> list[int] | None:
    """``--states 5,10,20`` as ``[5, 10, 20]``; None for None; ``ValueError`` with the one line to print."""
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise ValueError(f"--states {shlex.quote(text)}: give checkpoint steps as whole numbers of at least 1, "
                         "separated by commas (5,10,20)")
    return [int(part) for part in parts]


def run(args, ok: bool) -> int:
    """``rlstab audit --counterfactual`` (``ok``: the shared flag checks passed). Every input is checked before
    anything is loaded, sampled or written; each problem is one line, exit status 2."""
    ok, runs, model, inputs = checked_inputs(args, ok)
    if not ok:
        return 2
    return on_threads(args, model, lambda: _run(args, inputs, model, runs))


def checked_inputs(args, ok: bool) -> tuple[bool, list | None, str, tuple | None]:
    """``(ok, runs, model, inputs)`` of the audits that start from saved states (``--counterfactual``, ``--mechanism
    --from``): ``--states`` parsed, the ``--from`` runs read (``--model`` and ``--task`` must be theirs), the one
    objective loaded with a mask to audit. One line per problem on stderr; ``ok`` False after any (or if given so)."""
    from rlstab.command_line import load_inputs
    from rlstab.demo.counterfactual import problems_of
    from rlstab.demo.counterfactual_states import StateError, lab_runs

    runs = None
    try:
        steps = parse_states(args.states)
    except ValueError as err:
        print(one_line(f"{COMMAND}: {err}"), file=sys.stderr)
        ok, steps = False, None
    model, task_name = args.model or "tiny", args.task or "add2"
    if args.sources:
        try:
            runs = lab_runs(args.sources, steps)
        except StateError as err:
            print(one_line(f"{COMMAND}: {err}"), file=sys.stderr)
            ok = False
        if runs:
            for flag, given, theirs in (("--model", args.model, runs[0].model), ("--task", args.task, runs[0].task)):
                if given is not None and given != theirs:
                    print(f"{COMMAND}: {flag} {given}: the --from runs are {theirs}'s; leave {flag} out",
                          file=sys.stderr)
                    ok = False
            model, task_name = runs[0].model, runs[0].task
    source = (args.objective or ["stapo"])[0]
    inputs = load_inputs([source], task_name, COMMAND)
    if inputs is not None:
        for problem in problems_of(inputs[0][0].objective):
            print(one_line(f"{COMMAND}: --objective {source}: {problem}"), file=sys.stderr)
            ok = False
    return ok and inputs is not None, runs, model, inputs


def on_threads(args, model: str, audit) -> int:
    """``audit()`` on ``--threads`` torch threads (default 1 for tiny, all for smollm2), restored after; a checkpoint
    damaged after the checks is one line, exit status 2, nothing written."""
    from rlstab.demo.counterfactual_states import StateError
    from rlstab.lazy import load

    torch = load()
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or (1 if model == "tiny" else threads))
    try:
        return audit()
    except StateError as err:
        print(one_line(f"{COMMAND}: {err}"), file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)


def _run(args, inputs, model: str, runs) -> int:
    from rlstab.demo.counterfactual import counterfactual_audit
    from rlstab.demo.counterfactual_report import document, printed
    from rlstab.demo.counterfactual_states import load_state, model_state, policy_for
    from rlstab.trainer.config import TrainConfig

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    (loss_fn,), (label,), task = inputs
    started = time.perf_counter()
    if runs:
        policy = policy_for(model, task, progress=log)
        states = [lambda run=run, step=step: load_state(run, step) for run in runs for step in run.checkpoints]
        source = {"kind": "lab", "model": model, "task": task.name,
                  "runs": [{"folder": str(r.folder), "objective": r.label, "seed": r.seed, "regime": r.regime.get("name"),
                            "steps": list(r.checkpoints)} for r in runs]}
    else:
        from rlstab.trainer.models import load_policy

        try:
            policy = load_policy(model, task, seed=args.seed, cache_dir=args.cache_dir, progress=log,
                                 warm_start_steps=args.warmup_steps)
        except (ImportError, RuntimeError) as err:
            print(f"{COMMAND}: {err}", file=sys.stderr)
            return 2
        lr = args.lr if args.lr is not None else TrainConfig.model_fields["lr"].default
        states = [model_state(policy, label="warm start" if model == "tiny" else "pretrained", lr=lr,
                              max_grad_norm=TrainConfig.model_fields["max_grad_norm"].default)]
        source = {"kind": "model", "model": model, "task": task.name, "lr": lr}
    data = counterfactual_audit(
        policy, task, loss_fn.objective, label, states, source=source,
        prompts=args.prompts or DEFAULT_PROMPTS[model], group_size=args.group_size, temperature=args.temperature,
        seed=args.seed, null_draws=args.null_draws or CounterfactualNumbers.model_fields["null_draws"].default,
        held_out=args.held_out or DEFAULT_HELD_OUT[model], log=log,
    )
    return write_outputs(args, data, document, printed, DATA_FILE, started=started, log=log)
