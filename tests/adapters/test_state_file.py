"""``rlstab_state.pt`` in a checkpoint folder: written whole or not at all, removed when there is no state."""

import os

import pytest
import torch

from rlstab.adapters import state_file
from rlstab.adapters.state_file import STATE_FILE, read_state, state_path, write_state

BAPO_STATE = {"surrogate (bapo)": {"clip_low": 0.6, "clip_high": 1.2, "steps": 3}}


def test_the_state_file_has_one_name_in_the_folder(tmp_path):
    assert STATE_FILE == "rlstab_state.pt"
    assert state_path(str(tmp_path)) == os.path.join(str(tmp_path), "rlstab_state.pt")


def test_a_written_state_reads_back_equal_and_leaves_no_partial_file(tmp_path):
    state = {**BAPO_STATE, "reweighters[0] (stare)": {"W": torch.tensor([1.1, 1.2]), "gate": True}}
    write_state(state, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["rlstab_state.pt"]
    back = read_state(state_path(str(tmp_path)))
    assert back["surrogate (bapo)"] == {"clip_low": 0.6, "clip_high": 1.2, "steps": 3}
    assert torch.equal(back["reweighters[0] (stare)"]["W"], torch.tensor([1.1, 1.2]))
    assert back["reweighters[0] (stare)"]["gate"] is True


def test_a_second_write_replaces_the_first(tmp_path):
    write_state(BAPO_STATE, str(tmp_path))
    write_state({"surrogate (bapo)": {"clip_low": 0.5, "clip_high": 1.3, "steps": 4}}, str(tmp_path))
    assert read_state(state_path(str(tmp_path)))["surrogate (bapo)"]["steps"] == 4


def test_an_empty_state_removes_the_file_an_earlier_save_left(tmp_path):
    write_state(BAPO_STATE, str(tmp_path))
    write_state({}, str(tmp_path))
    assert os.listdir(tmp_path) == []
    write_state({}, str(tmp_path))  # nothing there: nothing to remove, no error
    assert os.listdir(tmp_path) == []


def test_an_interrupted_save_keeps_the_earlier_file_whole(tmp_path, monkeypatch):
    write_state(BAPO_STATE, str(tmp_path))

    def interrupted(obj, path):
        with open(path, "wb") as f:
            f.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(state_file.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_state({"surrogate (bapo)": {"steps": 9}}, str(tmp_path))
    monkeypatch.undo()
    assert read_state(state_path(str(tmp_path))) == BAPO_STATE  # the half file went to the partial name only


def test_reading_refuses_a_pickled_object_that_is_not_plain_values(tmp_path):
    path = state_path(str(tmp_path))
    torch.save({"state": os.system}, path)  # a callable: weights_only loading must refuse it
    with pytest.raises(Exception, match="Weights only load failed"):
        read_state(path)
