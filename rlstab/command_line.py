"""What ``rlstab demo``, ``rlstab audit`` and ``rlstab compare`` share on the command line.

The objectives' display labels, loading the objectives and the task with one line per problem, the
run's ``TrainConfig`` from the flags (their numbers are checked by ``rlstab.number_flags``, their
folders by ``rlstab.path_flags``), the flags that do not apply to ``--model smollm2``, and whether
an optional package is installed (Ray for ``compare --ray-address``, OpenRLHF for its launcher),
asked before any work is done: ``demo``, ``audit`` and ``compare`` draw their curves with
matplotlib (the ``demo`` extra), and finding out after minutes of training, with a traceback and no
summary written, wastes the run.

Imports nothing heavy at module level: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

MODEL_NAMES = ("tiny", "smollm2")
"""The ``--model`` choices (``rlstab.trainer.models.MODEL_NAMES``, which imports torch)."""
TINY_ONLY = ("warmup_steps", "cache_dir")
"""The flags of the tiny model's warm start: SmolLM2 is pretrained, and ignores them."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported: a folder of that name in the working directory is a namespace package to
    ``find_spec``, not the package (Ray leaves a ``ray`` session folder in the temporary folder)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def missing_plotting(command: str) -> str | None:
    """One line saying what to install when matplotlib is missing, else None."""
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return f"{command}: its curves need matplotlib, which is not installed: pip install 'rlstab[demo]'"


def tiny_only(args: argparse.Namespace, command: str) -> bool:
    """False after one line per flag of :data:`TINY_ONLY` given with ``--model smollm2``, which would ignore it."""
    if getattr(args, "model", None) != "smollm2":
        return True
    given = [dest for dest in TINY_ONLY if getattr(args, dest, None) is not None]
    for dest in given:
        flag = "--" + dest.replace("_", "-")
        print(f"{command}: {flag} applies to --model tiny only (SmolLM2 is pretrained, without a warm start); "
              f"leave it out", file=sys.stderr)
    return not given


def objective_labels(sources: list[str]) -> list[str]:
    """Display names: the preset's or file's ``name`` (else the file stem), made unique with ``#2``..."""
    from rlstab.loading import load

    labels = []
    for source in sources:
        objective = load(source)
        label = objective.name or Path(source).stem
        labels.append(label)
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if labels.count(label) == 1 else f"{label}#{seen[label]}")
    return unique


def load_inputs(sources: list[str], task_name: str, command: str, *, model: str | None = None):
    """``(compiled objectives, their labels, the task)``, or None after printing one line per bad one (of them, and of
    ``model`` when given: one of :data:`MODEL_NAMES`)."""
    from rlstab.errors import ConfigError, one_line
    from rlstab.loading import load
    from rlstab.trainer.tasks import get_task

    compiled, bad = [], 0
    for source in sources:
        try:
            compiled.append(load(source).compile())
        except ConfigError as err:
            print(err, file=sys.stderr)
            bad += 1
        except (OSError, ValueError) as err:
            print(one_line(f"{command}: {err}"), file=sys.stderr)
            bad += 1
    try:
        task = get_task(task_name)
    except ValueError as err:
        print(one_line(f"{command}: {err}"), file=sys.stderr)
        bad += 1
    if model is not None and model not in MODEL_NAMES:
        print(one_line(f"{command}: unknown model {model!r}; choose one of {', '.join(MODEL_NAMES)}"), file=sys.stderr)
        bad += 1
    return None if bad else (compiled, objective_labels(sources), task)


def train_config(args: argparse.Namespace, command: str):
    """The ``TrainConfig`` of the flags named as its fields (``--group-size``), or None after one line per problem.

    Each flag's own range was checked by ``rlstab.number_flags.check_numbers``; what is left is what
    relates several fields.
    """
    from pydantic import ValidationError

    from rlstab.errors import one_line
    from rlstab.trainer.config import TrainConfig

    values = {name: getattr(args, name) for name in TrainConfig.model_fields if hasattr(args, name)}
    try:
        return TrainConfig(**values)
    except ValidationError as err:
        for problem in err.errors():
            where = " ".join("--" + str(name).replace("_", "-") for name in problem["loc"])
            message = problem["msg"].removeprefix("Value error, ")
            print(one_line(f"{command}: {where + ': ' if where else ''}{message}"), file=sys.stderr)
    return None
