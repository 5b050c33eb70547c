"""The objective's state beside TRL's checkpoint files: written where TRL saved, read back on resume.

Whole runs that save and resume are in test_catalogue.py; these drive ``save_state`` / ``load_state``
on the real trainer.
"""

import os

import pytest
from transformers import TrainingArguments

from rlstab.adapters.trl.checkpoint import load_state, save_state

from trl_tiny import make_trainer

BAPO = "surrogate (bapo)"
MOVED = {BAPO: {"clip_low": 0.7, "clip_high": 1.3, "steps": 5}}  # bounds within BAPO's search, after 5 steps
INITIAL = {BAPO: {"clip_low": 0.6, "clip_high": 1.2, "steps": 0}}


@pytest.fixture
def trainer(tmp_path):
    trainer = make_trainer(tmp_path, "bapo")
    trainer.state.global_step = 7
    (tmp_path / "checkpoint-7").mkdir()  # the folder TRL's _save_checkpoint has just written
    return trainer


def test_the_state_goes_into_the_checkpoint_folder_trl_just_saved(trainer, tmp_path):
    trainer.rlstab_compiled.load_state_dict(MOVED)
    save_state(trainer, None)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-7"]
    assert os.listdir(tmp_path / "checkpoint-7") == ["rlstab_state.pt"]  # <output_dir>/checkpoint-<global_step>


def test_a_process_that_does_not_save_writes_nothing(trainer, tmp_path, monkeypatch):
    trainer.rlstab_compiled.load_state_dict(MOVED)
    monkeypatch.setattr(TrainingArguments, "should_save", property(lambda args: False))
    save_state(trainer, None)
    assert os.listdir(tmp_path / "checkpoint-7") == []


def test_resuming_restores_the_state_saved_in_the_checkpoint(trainer, tmp_path):
    trainer.rlstab_compiled.load_state_dict(MOVED)
    save_state(trainer, None)
    resumed = make_trainer(tmp_path / "resumed", "bapo")
    assert resumed.rlstab_compiled.state_dict() == INITIAL
    load_state(resumed, str(tmp_path / "checkpoint-7"))
    assert resumed.rlstab_compiled.state_dict() == MOVED


def test_a_checkpoint_without_the_file_or_no_checkpoint_leaves_the_state(trainer, tmp_path):
    trainer.rlstab_compiled.load_state_dict(MOVED)
    (tmp_path / "checkpoint-3").mkdir()  # saved by a run without rlstab's loss
    load_state(trainer, str(tmp_path / "checkpoint-3"))
    load_state(trainer, None)
    assert trainer.rlstab_compiled.state_dict() == MOVED


def test_a_stateless_objective_removes_a_file_an_earlier_save_left(tmp_path):
    trainer = make_trainer(tmp_path, "grpo")
    trainer.state.global_step = 2
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / "rlstab_state.pt").write_bytes(b"left by another run")
    save_state(trainer, None)
    assert os.listdir(folder) == []
