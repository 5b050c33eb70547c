"""The seven parts every trainer adapter has, under the same file names: the one table of them.

``tests/adapters/test_skeleton.py`` checks every adapter folder (one per entry of
[`trainers.TRAINERS`][rlstab.adapters.trainers.TRAINERS]) against it, and the docs page "Writing an
adapter" lists the same parts. A new adapter that lacks one fails that test, naming the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

PARTS: dict[str, str] = {
    "inputs": "the one place the trainer's tensors become a TokenBatch",
    "counts": "the trainer's counts of the step as the step's denominators",
    "step_scope": "step-wide statistics, gathered where the trainer knows a whole optimizer step",
    "loss": "the loss the trainer calls",
    "config": "start-up checks, torch-free, naming the config path and value",
    "checkpoint": "the objective's state saved and restored with the trainer's checkpoint",
    "metrics": "the objective's metrics in the trainer's own logging, combined as Metrics.combines declares",
}
"""Part (the module's name in ``rlstab/adapters/<trainer>/``) -> its one job."""


def missing_parts(folder: Path) -> list[str]:
    """What ``folder`` (an adapter's package) lacks of the skeleton, one line each; [] when it has every part.

    A part is there when ``<part>.py`` exists and opens with a docstring (which says how the part does
    its job in that trainer). ``__init__.py`` (what users import) is required too. Reads the files,
    imports nothing (the trainers are optional extras).
    """
    out = []
    for part in ("__init__", *PARTS):
        path = folder / f"{part}.py"
        if not path.is_file():
            out.append(f"{folder.name}/{part}.py is missing" + (f" ({PARTS[part]})" if part in PARTS else ""))
        elif ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) is None:
            out.append(f"{folder.name}/{part}.py has no docstring saying what it does")
    return out
