"""The compiled objective's state in veRL's actor checkpoint (``rlstab_state.pt``), saved and restored with it.

Stateful components (STARE's gate and adaptive controller, BAPO's bounds) keep their state in the
compiled objective of each worker process. veRL's checkpoint holds the model, the optimizer, the
learning-rate scheduler and the RNG, not this: without it a resumed run would restart STARE's W and M
from their initial values and train differently from the run it continues.

Where: ``TrainingWorker.save_checkpoint`` and ``load_checkpoint``, which ``ActorRolloutRefWorker``
calls for the actor and which every rank runs (``Dispatch.ONE_TO_ALL``). The wraps run veRL's own
save or load first, unchanged, then:

- **save**: ``compiled.state_dict()`` is written as ``<local_path>/rlstab_state.pt``
  ([`write_state`][rlstab.adapters.state_file.write_state], as the TRL adapter writes it) by global
  rank 0 only: the state is identical on every rank, because it moves from statistics gathered over
  all of them. Then a barrier, so that no rank returns before the checkpoint is whole. Nothing is
  written when no component keeps state, and a file left in that folder by an earlier save is
  removed: the folder then describes this save only.
- **load**: rank 0 reads the file and broadcasts what it found; every rank restores it with
  ``load_state_dict``. Only rank 0 needs to see the file, on the disk where rank 0 wrote it, as
  each FSDP rank reads only its own shard files (veRL asks for no shared file system).
- **no file**, for an objective that keeps state (a checkpoint saved before this adapter wrote the
  file, or by a run without rlstab's loss): a warning, and the state starts from its initial
  values, reset here in case this worker had trained before the load. The run goes on: refusing
  would make such checkpoints unusable, and veRL resumes the rest of the run the same way.
- **a state that does not fit** the objective (saved by another objective, or edited):
  [`StateError`][rlstab.StateError], naming the file and what to do, on every rank.

Remote paths: veRL's FSDP checkpoint manager reads its files through ``copy_to_local``, so the
``local_path`` of a load may be an HDFS path; the state file is read the same way (and its local
copy removed after loading when ``del_local_after_load`` asks it). ``hdfs_path`` on save is not
handled: veRL 0.9's FSDP manager ignores it too, its Megatron manager uploads the folder at the end
of its own save, before this file exists, and veRL's trainer refuses to resume from HDFS. Copy
``rlstab_state.pt`` along with the folder when you move a checkpoint.

The state goes with veRL's ``extra`` checkpoint contents (the learning-rate scheduler and the RNG,
the run's progress beside its weights): with ``actor.checkpoint.save_contents`` or
``load_contents`` without ``extra`` (a warm start from another run's weights, say), it is neither
saved nor restored, as the scheduler is not.

When a worker's loss is not rlstab's, both calls are veRL's alone (a load only warns if the folder
holds a state file that nothing will read).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING

from rlstab.adapters.patching import patch_once
from rlstab.adapters.state_file import STATE_FILE, read_state, state_path, write_state
from rlstab.adapters.verl.config import RlstabPolicyLossConfig, worker_policy_loss
from rlstab.errors import StateError
from rlstab.lazy import torch

if TYPE_CHECKING:
    from rlstab.compiled import CompiledObjective

_log = logging.getLogger(__name__)


def wrap_training_worker(training_worker_class: type) -> None:
    """Wrap ``TrainingWorker.save_checkpoint`` and ``load_checkpoint`` (idempotent)."""
    patch_once(training_worker_class, "save_checkpoint", _saving_state, key=__name__)
    patch_once(training_worker_class, "load_checkpoint", _loading_state, key=__name__)


def _saving_state(save):
    @functools.wraps(save)  # keeps verl's dispatch registration (function attributes)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        result = save(self, local_path, hdfs_path, global_step, max_ckpt_to_keep)
        policy_loss = worker_policy_loss(self)
        if policy_loss is not None and local_path is not None and _with_extra(self, "save_contents"):
            save_state(policy_loss.rlstab_compiled, local_path)
        return result

    return save_checkpoint


def _loading_state(load):
    @functools.wraps(load)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        result = load(self, local_path, hdfs_path, del_local_after_load)
        if local_path is None:  # veRL loads nothing either
            return result
        policy_loss = worker_policy_loss(self)
        if policy_loss is not None:
            if _with_extra(self, "load_contents"):
                load_state(policy_loss, local_path, del_local_after_load)
            elif _rank() == 0:
                _log.info("rlstab: checkpoint.load_contents has no 'extra': the objective's state is not restored")
        elif _rank() == 0 and os.path.exists(state_path(local_path)):  # a local folder only
            _log.warning(
                "rlstab: %s holds a state file, but this worker's loss is not rlstab's (or is not set yet): ignored",
                local_path,
            )
        return result

    return load_checkpoint


def _with_extra(worker, contents: str) -> bool:
    """Whether veRL's checkpoint ``save_contents``/``load_contents`` include ``extra`` (true when unknown)."""
    listed = getattr(getattr(worker, "checkpoint_config", None), contents, None)
    return listed is None or "extra" in listed


def save_state(compiled: CompiledObjective, folder: str) -> None:
    """Write ``compiled.state_dict()`` to ``folder/rlstab_state.pt`` on rank 0 (or remove a stale file there)."""
    if _rank() == 0:
        write_state(compiled.state_dict(), folder)
    _barrier()


def load_state(policy_loss: RlstabPolicyLossConfig, folder: str, del_local_after_load: bool = False) -> None:
    """Restore the state saved in ``folder`` on every rank (read on rank 0, broadcast); see the module docstring.

    Raises [`StateError`][rlstab.StateError] when the file's state does not fit the objective or
    cannot be read; every rank raises the same.
    """
    path = state_path(folder)
    found = _read(path, del_local_after_load) if _rank() == 0 else None
    found = _broadcast(found)
    compiled = policy_loss.rlstab_compiled
    status, value = found
    if status == "unreadable":
        raise StateError(
            f"{path}: cannot read the rlstab state ({value}). Resume from another checkpoint, or delete "
            f"{STATE_FILE} to start the components' state from its initial values"
        )
    if status == "missing":
        initial = policy_loss.rlstab_objective.compile().state_dict()
        if initial and _rank() == 0:
            _log.warning(
                "rlstab: %s has no %s; the state of %s starts from its initial values "
                "(a checkpoint saved without rlstab's checkpoint support, or by a run without rlstab's loss)",
                folder, STATE_FILE, ", ".join(sorted(initial)),
            )
        compiled.load_state_dict(initial)
        return
    try:
        compiled.load_state_dict(value)
    except StateError as err:
        raise StateError(
            f"{path} does not fit the objective {policy_loss.rlstab_objective.name or '(custom)'}: {err}. "
            f"Resume with the objective this checkpoint was saved with, or delete {STATE_FILE} from the "
            "checkpoint folder to start the components' state from its initial values"
        ) from err
    if _rank() == 0:
        _log.info("rlstab: restored the state of %s from %s", ", ".join(sorted(value)) or "no component", path)


def _read(path: str, del_local_after_load: bool) -> tuple[str, object]:
    """``("state", dict)``, ``("missing", None)`` or ``("unreadable", reason)``: never raises, so no rank waits forever."""
    try:
        if not _exists(path):
            return "missing", None
        from verl.utils.fs import copy_to_local, is_non_local

        local = copy_to_local(path)  # the path itself when it is local
        try:
            return "state", read_state(local)
        finally:
            if del_local_after_load and is_non_local(path):
                os.remove(local)
    except Exception as err:  # noqa: BLE001 - reported on every rank by load_state
        return "unreadable", f"{type(err).__name__}: {err}"


def _exists(path: str) -> bool:
    from verl.utils.fs import is_non_local

    if is_non_local(path):
        from verl.utils import hdfs_io

        return hdfs_io.exists(path)
    return os.path.exists(path)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def _broadcast(value):
    """Rank 0's ``value`` on every rank (objects go over the CPU backend of veRL's ``cpu:gloo,<device>:...`` group)."""
    if not _distributed() or torch.distributed.get_world_size() == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
