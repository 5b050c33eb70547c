"""``rlstab audit --mechanism --from DIR``: the run (``rlstab.demo.mechanism_along`` computes, ``..._report`` lays out).

Its flags are the audit's (``rlstab.demo.counterfactual_command`` holds ``--from``, ``--states``, ``--null-draws`` and
checks where each applies). Only the standard library at import time: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import sys
import time

COMMAND = "rlstab audit"
DATA_FILE = "mechanism.json"
DEFAULT_PROMPTS = {"tiny": 64, "smollm2": 16}
"""Problems per state's batch by default (x ``--group-size`` responses), the counterfactual audit's."""


def run(args, ok: bool) -> int:
    """``rlstab audit --mechanism --from`` (``ok``: the shared flag checks passed). Every input is checked before
    anything is loaded, sampled or written (``counterfactual_command.checked_inputs``); each problem is one line,
    exit status 2."""
    from rlstab.demo.counterfactual_command import checked_inputs, on_threads

    ok, runs, model, inputs = checked_inputs(args, ok)
    if not ok:
        return 2
    return on_threads(args, model, lambda: _run(args, inputs, runs))


def regime_temperature(run, given: float | None) -> float:
    """The temperature a run's states are sampled at: ``--temperature`` if given, else the run's regime's (its
    ``spec.json``), else the trainer's default."""
    from rlstab.trainer.config import TrainConfig

    if given is not None:
        return given
    return float(run.regime.get("temperature", TrainConfig.model_fields["temperature"].default))


def _run(args, inputs, runs) -> int:
    from rlstab.demo.counterfactual_command import CounterfactualNumbers, write_outputs
    from rlstab.demo.counterfactual_states import load_state, policy_for
    from rlstab.demo.mechanism_along import mechanism_along
    from rlstab.demo.mechanism_along_report import document, printed

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    (loss_fn,), (label,), task = inputs
    model = runs[0].model
    started = time.perf_counter()
    policy = policy_for(model, task, progress=log)
    states = [(lambda run=run, step=step: load_state(run, step), regime_temperature(run, args.temperature))
              for run in runs for step in run.checkpoints]
    source = {"kind": "lab", "model": model, "task": task.name,
              "runs": [{"folder": str(r.folder), "objective": r.label, "seed": r.seed, "regime": r.regime.get("name"),
                        "temperature": regime_temperature(r, args.temperature), "steps": list(r.checkpoints)}
                       for r in runs]}
    log(f"mechanism: {len(states)} states of {len(runs)} runs ({model} on {task.name}), objective {label}")
    data = mechanism_along(
        policy, task, loss_fn.objective, label, states, source=source,
        prompts=args.prompts or DEFAULT_PROMPTS[model], group_size=args.group_size, seed=args.seed,
        null_draws=args.null_draws or CounterfactualNumbers.model_fields["null_draws"].default, log=log,
    )
    return write_outputs(args, data, document, printed, DATA_FILE, started=started, log=log)
