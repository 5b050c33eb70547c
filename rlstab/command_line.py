"""What ``rlstab demo``, ``rlstab audit`` and ``rlstab compare`` share on the command line.

The objectives' display labels, loading the objectives and the task with one line per problem, the
run's ``TrainConfig`` from the flags (their numbers are checked by ``rlstab.number_flags``), and
whether the optional plotting packages are installed, asked before any work is done: ``demo``, ``audit`` and ``compare`` draw their curves
with matplotlib (the ``demo`` extra), and finding out after minutes of training, with a traceback
and no summary written, wastes the run.

Imports nothing heavy at module level: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def missing_plotting(command: str) -> str | None:
    """One line saying what to install when matplotlib is missing, else None."""
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return f"{command}: its curves need matplotlib, which is not installed: pip install 'rlstab[demo]'"


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


def load_inputs(sources: list[str], task_name: str, command: str):
    """``(compiled objectives, their labels, the task)``, or None after printing one line per bad one."""
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
