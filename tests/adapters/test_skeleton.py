"""Every adapter folder has the seven parts of the skeleton (``rlstab.adapters.skeleton.PARTS``)."""

from pathlib import Path

import pytest

import rlstab.adapters
from rlstab.adapters.skeleton import PARTS, missing_parts
from rlstab.adapters.trainers import TRAINERS

ADAPTERS = Path(rlstab.adapters.__file__).parent
WRITING = Path(__file__).parents[2] / "docs" / "adapters" / "writing.md"


def test_the_skeleton_has_seven_parts():
    assert list(PARTS) == ["inputs", "counts", "step_scope", "loss", "config", "checkpoint", "metrics"]


FOLDERS = sorted({t.folder for t in TRAINERS.values()})  # TRL's GRPOTrainer and AsyncGRPOTrainer share trl/


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_adapter_has_every_part(folder):
    assert missing_parts(ADAPTERS / folder) == []


def test_every_adapter_folder_is_a_trainer_of_the_table():
    folders = sorted(p.parent.name for p in ADAPTERS.glob("*/__init__.py"))
    assert folders == FOLDERS


def test_a_folder_without_a_part_is_named(tmp_path):
    """By construction: the check fails for an adapter that lacks a part, or has one that says nothing."""
    folder = tmp_path / "newtrainer"
    folder.mkdir()
    for part in ("__init__", *PARTS):
        (folder / f"{part}.py").write_text(f'"""The {part} of a new trainer."""\n')
    assert missing_parts(folder) == []
    (folder / "metrics.py").unlink()
    (folder / "counts.py").write_text("X = 1\n")
    assert missing_parts(folder) == [
        "newtrainer/counts.py has no docstring saying what it does",
        f"newtrainer/metrics.py is missing ({PARTS['metrics']})",
    ]


def test_the_writing_page_lists_every_part():
    rows = {line.split("|")[1].strip() for line in WRITING.read_text().splitlines() if line.startswith("| `")}
    assert {f"`{part}.py`" for part in PARTS} <= rows
