"""What ``rlstab demo``, ``rlstab audit`` and ``rlstab compare`` share on the command line.

Argument types that give argparse's one-line errors, the objectives' display labels, loading the
objectives and the task with one line per problem, and whether the optional plotting packages are
installed, asked before any work is done: ``demo``, ``audit`` and ``compare`` draw their curves
with matplotlib (the ``demo`` extra), and finding out after minutes of training, with a traceback
and no summary written, wastes the run.

Imports nothing heavy at module level: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


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
    """``(compiled objectives, their labels, the task)``, or None after printing why one is bad."""
    from rlstab.errors import ConfigError
    from rlstab.loading import load
    from rlstab.trainer.tasks import get_task

    try:
        return [load(s).compile() for s in sources], objective_labels(sources), get_task(task_name)
    except ConfigError as err:
        print(err, file=sys.stderr)
    except (OSError, ValueError) as err:
        print(f"{command}: {err}", file=sys.stderr)
    return None


def train_config(args: argparse.Namespace, command: str):
    """The ``TrainConfig`` of the flags named as its fields (``--group-size``), or None after one line per problem."""
    from pydantic import ValidationError

    from rlstab.trainer.config import TrainConfig

    values = {name: getattr(args, name) for name in TrainConfig.model_fields if hasattr(args, name)}
    try:
        return TrainConfig(**values)
    except ValidationError as err:
        for problem in err.errors():
            name = str(problem["loc"][0])
            flag = "--" + name.replace("_", "-")
            print(f"{command}: {flag} {values.get(name)!r}: {problem['msg'].lower()}", file=sys.stderr)
    return None
