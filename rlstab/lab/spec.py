"""What determines one run of the lab, and the folder it lives in.

A run is determined by (objective, seed, regime, task, model, steps) and the torch build it runs
on: its folder holds ``spec.json`` with exactly those, and an existing folder whose spec differs
is refused rather than resumed (a changed objective file, regime or step count would otherwise be
silently mixed into old results).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import rlstab
from rlstab.lab.regimes import Regime
from rlstab.lazy import torch

SPEC_FILE = "spec.json"

LATER_FIELDS = {"warm_start_band": None, "pass_k": 0, "pass_samples": 16, "instruments": False}
"""Regime fields added after run folders were first written, with their defaults: left out of a run's
identity while at them, so that a folder written before they existed still resumes."""


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid. ``objective`` is the objective's YAML (``Objective.to_yaml``), so a worker
    process or a Ray task rebuilds exactly the objective the driver validated."""

    label: str
    objective: str
    fingerprint: str
    regime: Regime
    task: str
    model: str
    seed: int
    steps: int

    def identity(self) -> dict:
        """The fields a resumed or skipped run must share with the folder's ``spec.json``."""
        regime = self.regime.model_dump(exclude={"description"})
        for name, default in LATER_FIELDS.items():  # at their defaults, as before they existed: old folders resume
            if regime[name] == default:
                del regime[name]
        return {
            "fingerprint": self.fingerprint,
            "regime": regime,
            "task": self.task,
            "model": self.model,
            "seed": self.seed,
            "steps": self.steps,
            "torch": torch.__version__,
        }

    def to_json(self) -> dict:
        data = asdict(self)
        data["regime"] = self.regime.model_dump()
        return {**data, **self.identity(), "rlstab": rlstab.__version__}

    def folder(self, out: Path) -> Path:
        return Path(out) / "runs" / self.regime.name / folder_name(self.label) / f"seed{self.seed}"


def folder_name(label: str) -> str:
    """``label`` with anything but letters, digits, ``_``, ``.`` and ``-`` replaced by ``_``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", label).lstrip(".")
    return name or "_"


def mismatch(spec: RunSpec, folder: Path) -> str | None:
    """Why ``folder`` cannot hold ``spec``'s run (None when it can: absent, new or the same run)."""
    path = folder / SPEC_FILE
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"{path} is unreadable ({err}); delete the folder to rerun it"
    expected = spec.identity()
    differing = [key for key in expected if saved.get(key) != json.loads(json.dumps(expected[key]))]
    if not differing:
        return None
    key = differing[0]
    return (
        f"{folder} holds a run with another {key} ({_brief(saved.get(key))}, now {_brief(expected[key])}); "
        "use another --out or delete that folder"
    )


def _brief(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def write_spec(spec: RunSpec, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SPEC_FILE
    if not path.exists():
        path.write_text(json.dumps(spec.to_json(), indent=1, sort_keys=True) + "\n")
