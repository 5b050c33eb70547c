"""Atomic files: a run's checkpoint, its metrics and its summary are whole or absent, never half written.

A SIGKILL can land anywhere; every file is written to a temporary name in the same folder and
renamed over the old one (``os.replace`` is atomic on POSIX), so a rerun finds either the previous
checkpoint or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from rlstab.lazy import torch
from rlstab.trainer.run import STATE_KEYS

CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
KEPT_FOLDER = "checkpoints"
"""Where ``--keep-checkpoints`` keeps every checkpoint of a run, ``step000010.pt`` and so on, after it finishes."""


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(temporary_path)``, then rename the temporary file to ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_checkpoint(folder: Path, state: dict) -> None:
    atomic_write(folder / CHECKPOINT_FILE, lambda tmp: torch.save(state, tmp))


def keep_checkpoint(folder: Path, step: int, state: dict) -> None:
    """``state`` (a checkpoint) kept as ``checkpoints/stepNNNNNN.pt`` in the run's folder: never overwritten by a later
    checkpoint, nor deleted when the run finishes (``rlstab audit --counterfactual --from`` reads them)."""
    kept = Path(folder) / KEPT_FOLDER
    kept.mkdir(exist_ok=True)
    atomic_write(kept / f"step{step:06d}.pt", lambda tmp: torch.save(state, tmp))


def kept_checkpoints(folder: Path) -> dict[int, Path]:
    """``{step: path}`` of the checkpoints kept in a run's folder, by step."""
    found = {}
    for path in (Path(folder) / KEPT_FOLDER).glob("step*.pt"):
        digits = path.stem[len("step"):]
        if digits.isdigit():
            found[int(digits)] = path
    return dict(sorted(found.items()))


def load_checkpoint(folder: Path) -> dict | None:
    path = folder / CHECKPOINT_FILE
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def write_rows(folder: Path, rows: Iterable[dict]) -> None:
    """``metrics.jsonl`` holding exactly ``rows`` (replacing whatever a killed run left after its checkpoint)."""
    text = "".join(json.dumps(row) + "\n" for row in rows)
    atomic_write(folder / METRICS_FILE, lambda tmp: Path(tmp).write_text(text))


def append_row(folder: Path, row: dict) -> None:
    with open(folder / METRICS_FILE, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(folder: Path) -> list[dict]:
    path = folder / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


CHECKPOINT_KEYS = STATE_KEYS | {"rows"}  # a run's state_dict() and its rows so far


def unreadable(folder: Path) -> str | None:
    """Why a run folder's files cannot be read back (None when they can, or the folder is new).

    A finished run needs its ``summary.json`` (an object) and ``metrics.jsonl`` (an object per
    line); an unfinished one needs a loadable ``checkpoint.pt`` if it has one. Files that rlstab
    wrote atomically are never half written, so this meets only files edited or damaged by hand;
    each gives one line naming the file, found before any training starts.
    """
    folder = Path(folder)
    summary = path = folder / SUMMARY_FILE
    try:
        if summary.exists():
            for path in (summary, folder / METRICS_FILE):
                lines = [path.read_text()] if path == summary else path.read_text().splitlines()
                if not all(isinstance(json.loads(line), dict) for line in lines if line.strip()):
                    raise ValueError("not a JSON object")
        elif (folder / CHECKPOINT_FILE).exists():
            path = folder / CHECKPOINT_FILE
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(saved, dict) or not CHECKPOINT_KEYS <= saved.keys():
                raise ValueError("not an rlstab lab checkpoint")
    except Exception as err:  # any damage (JSON, unpickling, I/O) is the same answer: this file cannot be used
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"{path} is unreadable ({reason}); delete the folder {folder} to rerun that run"
    return None


def write_json(path: Path, data: dict) -> None:
    """``data`` as indented JSON, keys in their order (the objectives' as given, a regime's fields' as declared)."""
    text = json.dumps(data, indent=1) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
