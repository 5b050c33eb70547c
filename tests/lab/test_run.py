"""One run: checkpoints, resume and skip give exactly the rows of a run never interrupted."""

import json

import pytest

from rlstab.lab.checkpoint import CHECKPOINT_FILE, SUMMARY_FILE, kept_checkpoints, load_checkpoint, read_rows
from rlstab.lab.regimes import load_regime
from rlstab.lab.run import execute
from rlstab.lab.spec import RunSpec, mismatch
from rlstab.loading import load

from quick_regimes import QUICK, QUICK_LAG, without_time


def spec(objective="grpo", regime=QUICK, steps=5, seed=0):
    o = load(objective)
    return RunSpec(objective, o.to_yaml(), o.fingerprint(), load_regime(regime), "add2", "tiny", seed, steps)


class Killed(Exception):
    pass


def die_at(step):
    def on_step(s):
        if s == step:
            raise Killed

    return on_step


@pytest.mark.parametrize(("objective", "regime"), [("bapo", QUICK_LAG), ("stare", QUICK), ("tis", QUICK_LAG), ("four_layers", QUICK_LAG)])
def test_a_run_resumed_from_its_checkpoint_equals_one_never_interrupted(tmp_path, cache, objective, regime):
    s = spec(objective, regime)
    whole = execute(s, tmp_path / "whole", cache_dir=cache, checkpoint_every=2)
    with pytest.raises(Killed):
        execute(s, tmp_path / "cut", cache_dir=cache, checkpoint_every=2, on_step=die_at(3))
    assert (tmp_path / "cut" / CHECKPOINT_FILE).exists()
    assert [r["step"] for r in read_rows(tmp_path / "cut")] == [0, 1, 2, 3]  # step 3 is past the checkpoint
    resumed = execute(s, tmp_path / "cut", cache_dir=cache, checkpoint_every=2)
    assert without_time(resumed["rows"]) == without_time(whole["rows"])
    assert without_time(read_rows(tmp_path / "cut")) == without_time(whole["rows"])  # step 3 written once
    assert {k: v for k, v in resumed["summary"].items() if k != "wall_time"} == {
        k: v for k, v in whole["summary"].items() if k != "wall_time"
    }
    assert not (tmp_path / "cut" / CHECKPOINT_FILE).exists()  # a finished run keeps no checkpoint


def test_the_checkpoint_holds_the_objectives_state(tmp_path, cache):
    with pytest.raises(Killed):
        execute(spec("bapo", QUICK_LAG), tmp_path, cache_dir=cache, checkpoint_every=2, on_step=die_at(3))
    saved = load_checkpoint(tmp_path)
    assert saved["step"] == 2
    (label, state), = saved["objective_state"].items()
    # two RL steps of two optimizer updates each: BAPO chose bounds 4 times (one per gather)
    assert label == "surrogate (bapo)" and state["steps"] == 4
    assert len(saved["snapshots"]) == 2  # lag 1: the weights after steps 1 and 2


def test_kept_checkpoints_stay_after_the_run_and_resume_to_its_rows(tmp_path, cache):
    import torch

    s = spec(steps=3)
    kept = execute(s, tmp_path / "kept", cache_dir=cache, checkpoint_every=2, keep_checkpoints=True)
    assert not (tmp_path / "kept" / CHECKPOINT_FILE).exists()  # the resumable checkpoint still goes at the end
    assert list(kept_checkpoints(tmp_path / "kept")) == [2]  # every checkpoint_every steps: 2 of 3
    saved = torch.load(kept_checkpoints(tmp_path / "kept")[2], weights_only=True)
    assert saved["step"] == 2 and [r["step"] for r in saved["rows"]] == [0, 1, 2]
    # the kept state is the run's: resumed from it, a run ends with the same rows
    (tmp_path / "again").mkdir()
    torch.save(saved, tmp_path / "again" / CHECKPOINT_FILE)
    again = execute(s, tmp_path / "again", cache_dir=cache, checkpoint_every=2)
    assert without_time(again["rows"]) == without_time(kept["rows"])
    assert not (tmp_path / "again" / "checkpoints").exists()  # kept only when asked


def test_a_finished_run_is_read_not_retrained(tmp_path, cache):
    s = spec(steps=2)
    first = execute(s, tmp_path, cache_dir=cache)
    (tmp_path / "metrics.jsonl").write_text((tmp_path / "metrics.jsonl").read_text())  # untouched below
    marker = json.loads((tmp_path / SUMMARY_FILE).read_text())
    again = execute(s, tmp_path, cache_dir=cache, on_step=die_at(1))  # would raise if it trained
    assert again["summary"] == marker == first["summary"]


def test_policy_lag_samples_with_stale_weights(tmp_path, cache):
    rows = execute(spec("grpo", QUICK_LAG, steps=3), tmp_path, cache_dir=cache, checkpoint_every=10)["rows"][1:]
    # Step 1 samples with the current policy (the warm start); from step 2 on the sampler is the policy
    # one step behind, so the rollouts' importance weights spread and ESS / N drops below 1.
    assert rows[0]["ess_fraction"] == pytest.approx(1.0, abs=1e-4)
    assert rows[1]["ess_fraction"] < 1.0 - 1e-4


def test_a_folder_of_another_run_is_refused(tmp_path, cache):
    execute(spec(steps=2), tmp_path, cache_dir=cache)
    assert mismatch(spec(steps=2), tmp_path) is None
    assert "another steps (2, now 3)" in mismatch(spec(steps=3), tmp_path)
    assert "another fingerprint" in mismatch(spec("stapo", steps=2), tmp_path)
    assert "another regime" in mismatch(spec(regime={**QUICK, "lr": 1e-4}, steps=2), tmp_path)
    assert "another seed" in mismatch(spec(steps=2, seed=1), tmp_path)
