"""The objective's state file in a trainer's checkpoint folder (``rlstab_state.pt``), for adapters that save into one.

Stateful components (STARE's gate and controller, BAPO's bounds) keep their state in the compiled
objective; a trainer's checkpoint holds the model, the optimizer and the scheduler, not this.
veRL's and TRL's adapters write it beside the trainer's files under one name (OpenRLHF's rides in
DeepSpeed's ``client_states`` instead). The state is plain values, saved with ``torch.save`` and
read back with ``weights_only=True``.
"""

from __future__ import annotations

import os

from rlstab.lazy import torch

STATE_FILE = "rlstab_state.pt"
"""The file, in a checkpoint folder, that keeps the state of the objective's stateful components."""


def state_path(folder: str) -> str:
    return os.path.join(folder, STATE_FILE)


def write_state(state: dict, folder: str) -> None:
    """Write ``state`` to ``folder/rlstab_state.pt`` whole or not at all; with no state, remove a file left there.

    Written to a temporary name and renamed, so that an interrupted save leaves no half file. An
    empty state (no component keeps any) removes a file an earlier save left, so that the folder
    describes this save only.
    """
    path = state_path(folder)
    if state:
        partial_path = f"{path}.partial"
        torch.save(state, partial_path)
        os.replace(partial_path, path)
    elif os.path.exists(path):
        os.remove(path)


def read_state(path: str) -> dict:
    """The state saved at ``path`` (a local file)."""
    return torch.load(path, weights_only=True)
