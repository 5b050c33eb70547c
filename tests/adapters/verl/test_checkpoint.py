"""The objective's state in veRL's actor checkpoint: saved by ``TrainingWorker.save_checkpoint``, restored by ``load_checkpoint``.

The resume tests run veRL's real ``TrainingWorker`` (fsdp2 engine, CPU, gloo; see
``test_training_worker.py``) in spawned processes, for STARE's adaptive controller and BAPO's bounds:

- the uninterrupted run trains three batches (different data each) and saves a checkpoint after the
  first, through veRL's own ``save_checkpoint``; saving only reads the model, optimizer, scheduler and
  RNG, so the run goes on as if it had not saved;
- the resumed run is a fresh process that loads that checkpoint through ``load_checkpoint`` and trains
  the other two batches: it must end with the same objective state and the same parameters (fp32).
  The same process then loads a copy of the checkpoint without ``rlstab_state.pt``: a warning, the
  state starts over, and the run ends elsewhere, which is what restoring the state prevents.

Two ranks are checked once (STARE): rank 0 alone writes the file, every rank restores the same state.
The last tests drive the wraps on a stand-in worker, without processes: stateless objectives, veRL's
checkpoint contents, other losses, unreadable files, remote paths, and the wrap itself.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
from functools import partial
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import checkpoint_rank  # noqa: E402
from test_training_worker import FP32, LOSSES, spawn_ranks  # noqa: E402

from rlstab import StateError  # noqa: E402
from rlstab.adapters.verl import checkpoint  # noqa: E402
from rlstab.adapters.verl.checkpoint import STATE_FILE  # noqa: E402
from rlstab.adapters.verl.config import RlstabPolicyLossConfig  # noqa: E402

import training_worker_rank as base  # noqa: E402

STARE, BAPO = "reweighters[0] (stare)", "surrogate (bapo)"
OBJECTIVES = {
    # Any entropy over the tiny model's 64 tokens is at most ln 64 = 4.16 (its batches' means are 2.7 to
    # 3.0): a target of 5 keeps STARE's gate open on every batch, so W and M weigh the loss, and the
    # controller moves them by alpha at every training batch (W 1.1 -> 1.2 -> 1.3 -> 1.4, M 0.9 -> 0.6).
    # top_p 0.5 and variant C2 reweight half of the tokens of either sign: W and M matter to the update.
    "stare": (
        "extends: stare\n"
        "reweighters:\n"
        "  - {kind: stare, variant: C2, top_p: 0.5, adaptive: true, alpha: 0.1, target_entropy: 5.0}\n"
    ),
    "bapo": "extends: bapo\n",  # bounds chosen at every optimizer step: two per training batch
}
SEEDS = (0, 1, 2)  # one training batch each (two optimizer steps of two micro-batches)
SAVED_AFTER = 1  # training batches before the checkpoint


def run_ranks(world_size: int, model_path: str, overrides: list[str], plan: list) -> list[dict]:
    """``plan`` (see ``checkpoint_rank``) on ``world_size`` spawned gloo ranks; each rank's record, by rank."""
    return spawn_ranks(checkpoint_rank.run_rank, world_size, model_path, overrides, plan)


class Runs:
    """The spawned runs, each run once per module and only when a test asks for it."""

    def __init__(self, folder):
        self.folder = folder
        self.model_path = str(folder / "tiny-llama")
        base.save_tiny_llama(self.model_path)
        self._done = {}

    def overrides(self, name: str) -> list[str]:
        objective = self.folder / f"{name}.yaml"
        objective.write_text(OBJECTIVES[name])
        rlstab_loss = [o for o in LOSSES["rlstab"] if ".objective=" not in o]
        return rlstab_loss + [f"+actor_rollout_ref.actor.policy_loss.objective={objective}"] + FP32

    def checkpoint(self, name: str, world_size: int = 1) -> str:
        return str(self.folder / f"{name}-{world_size}-ranks" / "global_step_1" / "actor")

    def _once(self, key, make):
        if key not in self._done:
            self._done[key] = make()
        return self._done[key]

    def uninterrupted(self, name: str) -> dict:
        """Three training batches, saving after the first."""
        plan = [("train", s) for s in SEEDS[:SAVED_AFTER]] + [("save", self.checkpoint(name))]
        plan += [("train", s) for s in SEEDS[SAVED_AFTER:]] + [("snapshot", "final")]
        return self._once(("uninterrupted", name), lambda: run_ranks(1, self.model_path, self.overrides(name), plan)[0])

    def resumed(self, name: str) -> dict:
        """A fresh process: the checkpoint, then the same without its state file; for BAPO, STARE's checkpoint too."""
        saved = self.checkpoint(name)
        self.uninterrupted(name)
        without_state = str(self.folder / f"{name}-without-state" / "actor")
        if not os.path.exists(without_state):
            shutil.copytree(saved, without_state, ignore=shutil.ignore_patterns(STATE_FILE))
        rest = [("train", s) for s in SEEDS[SAVED_AFTER:]]
        plan = [("load", saved), ("snapshot", "loaded")] + rest + [("snapshot", "resumed")]
        plan += [("load", without_state), ("snapshot", "loaded without state")] + rest + [("snapshot", "resumed without state")]
        if name == "bapo":
            self.uninterrupted("stare")
            plan += [("load_fails", self.checkpoint("stare"))]
        return self._once(("resumed", name), lambda: run_ranks(1, self.model_path, self.overrides(name), plan)[0])

    def two_ranks(self) -> list[dict]:
        """STARE on two ranks: save after one batch, train one more, load the checkpoint, train that batch again."""
        saved = self.checkpoint("stare", world_size=2)
        plan = [("train", 0), ("save", saved), ("train", 1), ("snapshot", "final"),
                ("load", saved), ("snapshot", "loaded"), ("train", 1), ("snapshot", "resumed")]
        return self._once("two ranks", lambda: run_ranks(2, self.model_path, self.overrides("stare"), plan))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("verl-checkpoint"))


def state_after(record: dict, action: str, argument) -> dict:
    (state,) = [s for a, arg, s, _ in record["states"] if (a, arg) == (action, argument)]
    return state


def logged(record: dict, action: str, argument) -> list[tuple[str, str]]:
    (messages,) = [m for a, arg, _, m in record["states"] if (a, arg) == (action, argument)]
    return messages


def max_difference(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_same_state(a: dict, b: dict) -> None:
    """Equal component states: flags and counts exactly, floats to 1e-6 (H_bar is a mean of recomputed entropies)."""
    assert a.keys() == b.keys()
    for label in a:
        assert a[label].keys() == b[label].keys(), label
        for field, value in a[label].items():
            other = b[label][field]
            if isinstance(value, float) and isinstance(other, float):
                assert value == pytest.approx(other, abs=1e-6), (label, field)
            else:
                assert value == other, (label, field)


# ------------------------------------------------------------------------------------------ the resume


@pytest.mark.parametrize("name", ["stare", "bapo"])
def test_the_checkpoint_holds_the_state_at_the_save(runs, name):
    run = runs.uninterrupted(name)
    saved = torch.load(os.path.join(runs.checkpoint(name), STATE_FILE), weights_only=True)
    assert saved == state_after(run, "save", runs.checkpoint(name))
    # The state moved in the first training batch, and again after the save: what the file keeps matters.
    assert saved != run["initial_state"]
    assert run["snapshots"]["final"]["state"] != saved
    if name == "stare":
        assert saved[STARE]["W"] == pytest.approx(1.2) and saved[STARE]["M"] == pytest.approx(0.8)
        assert saved[STARE]["gate"] is True and 0 < saved[STARE]["H_bar"] < math.log(base.VOCAB)
        assert run["snapshots"]["final"]["state"][STARE]["W"] == pytest.approx(1.4)
    else:
        steps_per_batch = base.BATCH // base.MINI_BATCH
        assert saved[BAPO]["steps"] == steps_per_batch
        assert run["snapshots"]["final"]["state"][BAPO]["steps"] == len(SEEDS) * steps_per_batch


@pytest.mark.parametrize("name", ["stare", "bapo"])
def test_a_resumed_run_ends_as_the_uninterrupted_one(runs, name):
    full, resumed = runs.uninterrupted(name), runs.resumed(name)
    assert resumed["initial_state"] != state_after(full, "save", runs.checkpoint(name))  # a fresh process
    assert resumed["snapshots"]["loaded"]["state"] == state_after(full, "save", runs.checkpoint(name))
    assert ("INFO", f"rlstab: restored the state of {sorted(full['initial_state'])[0]} from "
            f"{os.path.join(runs.checkpoint(name), STATE_FILE)}") in logged(resumed, "load", runs.checkpoint(name))
    final, end = full["snapshots"]["final"], resumed["snapshots"]["resumed"]
    assert_same_state(end["state"], final["state"])
    assert max_difference(end["params"], final["params"]) < 1e-6


@pytest.mark.parametrize("name", ["stare", "bapo"])
def test_without_the_state_file_the_state_starts_over_with_a_warning(runs, name):
    full, resumed = runs.uninterrupted(name), runs.resumed(name)
    without_state = str(runs.folder / f"{name}-without-state" / "actor")
    (warning,) = logged(resumed, "load", without_state)
    assert warning[0] == "WARNING"
    assert f"{without_state} has no {STATE_FILE}" in warning[1] and "initial values" in warning[1]
    # Reset, although this worker had trained (and restored a state) before the load.
    assert resumed["snapshots"]["loaded without state"]["state"] == resumed["initial_state"]
    end, final = resumed["snapshots"]["resumed without state"], full["snapshots"]["final"]
    assert end["state"] != final["state"]
    if name == "stare":
        # W and M weigh the loss: starting them over moves the parameters elsewhere.
        assert end["state"][STARE]["W"] == pytest.approx(1.3)
        assert max_difference(end["params"], final["params"]) > 1e-3
    else:
        # BAPO's search restarts from its start bounds every step: only its record (the step count) differs.
        assert end["state"][BAPO]["steps"] == final["state"][BAPO]["steps"] - base.BATCH // base.MINI_BATCH


def test_a_state_that_does_not_fit_the_objective_fails_naming_the_file(runs):
    """STARE's checkpoint loaded by a BAPO objective: veRL loads the model, then the state is refused."""
    (name, message), = runs.resumed("bapo")["errors"].values()
    assert name == "StateError"
    assert message.startswith(f"{os.path.join(runs.checkpoint('stare'), STATE_FILE)} does not fit the objective")
    assert STARE in message and BAPO in message  # the StateError's own text
    assert "Resume with the objective this checkpoint was saved with" in message
    assert f"delete {STATE_FILE}" in message


def test_two_ranks_rank_zero_writes_and_every_rank_restores_the_same_state(runs):
    ranks = runs.two_ranks()
    folder = runs.checkpoint("stare", world_size=2)
    assert sorted(f for f in os.listdir(folder) if "rlstab" in f) == [STATE_FILE]  # no temporary file left
    saved = torch.load(os.path.join(folder, STATE_FILE), weights_only=True)
    for r in ranks:
        assert state_after(r, "save", folder) == saved
        assert r["snapshots"]["final"]["state"] != saved  # the load moves every rank's state back
        assert r["snapshots"]["loaded"]["state"] == saved
        assert_same_state(r["snapshots"]["resumed"]["state"], r["snapshots"]["final"]["state"])
        assert max_difference(r["snapshots"]["resumed"]["params"], r["snapshots"]["final"]["params"]) < 1e-6
    assert ranks[0]["snapshots"]["resumed"]["state"] == ranks[1]["snapshots"]["resumed"]["state"]
    # Only rank 0 reads the file and logs.
    assert logged(ranks[0], "load", folder) and not logged(ranks[1], "load", folder)


# ------------------------------------------------------------------------------------------ the wraps, in-process


@pytest.fixture
def worker_class():
    """A stand-in for ``TrainingWorker``: records veRL's part of each call; wrapped as the adapter wraps veRL's."""

    class Worker:
        def __init__(self, policy_loss):
            config = SimpleNamespace(policy_loss=policy_loss)
            self.loss_fn = partial(lambda **kwargs: None, config=config)  # as partial(ppo_loss, config=...)
            self.calls = []

        def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
            self.calls.append(("save", local_path, hdfs_path, global_step, max_ckpt_to_keep))

        def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
            self.calls.append(("load", local_path, hdfs_path, del_local_after_load))

    checkpoint.wrap_training_worker(Worker)
    return Worker


def rlstab_loss(objective: str) -> RlstabPolicyLossConfig:
    return RlstabPolicyLossConfig(objective=objective)


BAPO_STATE = {BAPO: {"clip_low": 0.7, "clip_high": 1.5, "steps": 3}}


def test_round_trip_and_verls_arguments_pass_through(worker_class, tmp_path):
    saving = worker_class(rlstab_loss("bapo"))
    saving.loss_fn.keywords["config"].policy_loss.rlstab_compiled.load_state_dict(BAPO_STATE)
    saving.save_checkpoint(str(tmp_path), "hdfs://remote/actor", 7, 2)
    assert saving.calls == [("save", str(tmp_path), "hdfs://remote/actor", 7, 2)]
    loading = worker_class(rlstab_loss("bapo"))
    loading.load_checkpoint(str(tmp_path), None, True)
    assert loading.calls == [("load", str(tmp_path), None, True)]
    assert loading.loss_fn.keywords["config"].policy_loss.rlstab_compiled.state_dict() == BAPO_STATE


def test_a_stateless_objective_writes_no_file_and_removes_a_stale_one(worker_class, tmp_path):
    (tmp_path / STATE_FILE).write_bytes(b"from an earlier save")
    worker = worker_class(rlstab_loss("stapo"))
    worker.save_checkpoint(str(tmp_path))
    assert not (tmp_path / STATE_FILE).exists()
    worker.load_checkpoint(str(tmp_path))  # nothing to restore, nothing to warn about


def test_the_state_goes_with_verls_extra_contents(worker_class, tmp_path):
    """Without ``extra`` (scheduler, RNG) in ``save_contents``/``load_contents`` the state is neither saved nor restored."""
    worker = worker_class(rlstab_loss("bapo"))
    worker.loss_fn.keywords["config"].policy_loss.rlstab_compiled.load_state_dict(BAPO_STATE)
    worker.checkpoint_config = SimpleNamespace(save_contents=["model", "optimizer"], load_contents=["model"])
    worker.save_checkpoint(str(tmp_path))
    assert not (tmp_path / STATE_FILE).exists()
    torch.save(BAPO_STATE, tmp_path / STATE_FILE)
    warm_start = worker_class(rlstab_loss("bapo"))
    warm_start.checkpoint_config = worker.checkpoint_config
    warm_start.load_checkpoint(str(tmp_path))
    assert warm_start.loss_fn.keywords["config"].policy_loss.rlstab_compiled.state_dict() != BAPO_STATE
    warm_start.checkpoint_config = SimpleNamespace(save_contents=["model"], load_contents=["model", "extra"])
    warm_start.load_checkpoint(str(tmp_path))
    assert warm_start.loss_fn.keywords["config"].policy_loss.rlstab_compiled.state_dict() == BAPO_STATE


def test_other_losses_are_verls_alone(worker_class, tmp_path, caplog):
    torch.save(BAPO_STATE, tmp_path / STATE_FILE)
    worker = worker_class(SimpleNamespace(loss_mode="vanilla"))
    worker.save_checkpoint(str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        worker.load_checkpoint(str(tmp_path))
    assert "not rlstab's" in caplog.text
    worker.loss_fn = None  # a worker whose loss is not set yet
    worker.load_checkpoint(str(tmp_path))
    assert [c[0] for c in worker.calls] == ["save", "load", "load"]


def test_an_unreadable_file_fails_naming_it(worker_class, tmp_path):
    (tmp_path / STATE_FILE).write_bytes(b"not a torch file")
    with pytest.raises(StateError, match=rf"(?s){STATE_FILE}: cannot read the rlstab state \(.*\)\. Resume from another"):
        worker_class(rlstab_loss("bapo")).load_checkpoint(str(tmp_path))


def test_a_remote_checkpoint_is_read_as_verl_reads_its_files(worker_class, tmp_path, monkeypatch):
    """veRL's FSDP manager reads ``local_path`` through ``copy_to_local`` (HDFS included); so does the state."""
    import verl.utils.fs
    import verl.utils.hdfs_io

    torch.save(BAPO_STATE, tmp_path / "on-hdfs.pt")
    copies = []

    def copy_to_local(src, **kwargs):
        assert src == f"hdfs://cluster/run/actor/{STATE_FILE}"
        copies.append(str(tmp_path / "local-copy.pt"))
        shutil.copy(tmp_path / "on-hdfs.pt", copies[-1])
        return copies[-1]

    monkeypatch.setattr(verl.utils.fs, "copy_to_local", copy_to_local)
    monkeypatch.setattr(verl.utils.hdfs_io, "exists", lambda path, **kwargs: path.endswith(STATE_FILE))
    worker = worker_class(rlstab_loss("bapo"))
    worker.load_checkpoint("hdfs://cluster/run/actor", del_local_after_load=True)
    assert worker.loss_fn.keywords["config"].policy_loss.rlstab_compiled.state_dict() == BAPO_STATE
    assert copies and not os.path.exists(copies[0])  # the local copy removed, as veRL removes its own


def test_verls_training_worker_is_wrapped_once_with_its_dispatch_attributes():
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine_workers import TrainingWorker

    for method in (TrainingWorker.save_checkpoint, TrainingWorker.load_checkpoint):
        assert method.__rlstab_wrapped__ and hasattr(method, MAGIC_ATTR)  # veRL's @register survives
    wrapped = TrainingWorker.save_checkpoint
    checkpoint.wrap_training_worker(TrainingWorker)
    assert TrainingWorker.save_checkpoint is wrapped
