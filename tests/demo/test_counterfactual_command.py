"""``rlstab audit --counterfactual``: every bad input is one line and exit status 2 with nothing written; from a lab
run's kept checkpoints, or from a model as loaded, it writes counterfactual.json and its audit.md section."""

from __future__ import annotations

import json

from rlstab.cli import main

# An untrained tiny model answers no perm3 problem right: every advantage is 0, the mask silences nothing, and
# each state takes two updates (the all-tokens one and its repeat): a fast end-to-end run.
SMALL = ["--prompts", "2", "--group-size", "2", "--held-out", "2", "--quiet"]


def test_from_a_lab_runs_checkpoints_it_writes_its_json_and_section(run_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["audit", "--counterfactual", "--from", str(run_folder), "--states", "10", *SMALL, "--out", str(out)]) == 0
    data = json.loads((out / "counterfactual.json").read_text())
    assert data["source"]["kind"] == "lab" and data["source"]["task"] == "perm3" and data["objective"] == "stapo"
    (state,) = data["states"]
    assert (state["label"], state["step"], state["lr"], state["fresh_adam"]) == ("seed0/step10", 10, 3e-4, False)
    assert state["restore_check"] == 0.0 and state["silenced"] == 0 and state["tests"] is None
    assert state["responses"] == 4 and state["held_out_problems"] == 2
    document = (out / "audit.md").read_text()
    assert document.startswith("# Counterfactual audit: tiny on perm3, objective stapo")
    nothing = "The mask silenced no token in any state: every arm is the all-tokens update, and there is nothing to rank."
    assert f"| seed0/step10 | {state['tokens']} | 0 | 0 | 0 | — | — | — | — | — | — |" in document and nothing in document
    printed = capsys.readouterr().out
    assert printed.startswith("# Counterfactual audit") and printed.rstrip().endswith(nothing)


def test_from_a_model_as_loaded_it_starts_with_a_fresh_adam(tmp_path):
    out = tmp_path / "out"
    assert main(["audit", "--counterfactual", "--warmup-steps", "1", "--cache-dir", str(tmp_path / "cache"),
                 "--lr", "1e-3", *SMALL, "--out", str(out)]) == 0
    data = json.loads((out / "counterfactual.json").read_text())
    assert data["source"] == {"kind": "model", "model": "tiny", "task": "add2", "lr": 1e-3}
    (state,) = data["states"]
    assert (state["label"], state["fresh_adam"], state["lr"]) == ("warm start", True, 1e-3)


def bad_inputs(run_folder, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "spec.json").write_text(json.dumps({"label": "dapo", "model": "tiny", "task": "perm3", "seed": 0,
                                                "regime": {}}))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "spec.json").write_text("{}")
    run = str(run_folder)
    return [
        (["--counterfactual", "--null-draws", "10"], "rlstab audit: --null-draws 10: must be an integer from 50 to 10,000"),
        (["--from", run], "rlstab audit: --from applies to --counterfactual or --mechanism only; leave it out"),
        (["--held-out", "4"], "rlstab audit: --held-out applies to --counterfactual only; leave it out"),
        (["--counterfactual", "--top-k", "3"],
         "rlstab audit: --top-k applies to the token audit, not to --counterfactual; leave it out"),
        (["--counterfactual", "--objective", "stapo", "--objective", "stapo-dose"],
         "rlstab audit: --counterfactual audits one objective's mask; give --objective once (got 2)"),
        (["--counterfactual", "--states", "5"],
         "rlstab audit: --states 5 needs --from (the steps of a lab run's checkpoints)"),
        (["--counterfactual", "--from", run, "--states", "5,x"],
         "rlstab audit: --states 5,x: give checkpoint steps as whole numbers of at least 1, separated by commas (5,10,20)"),
        (["--counterfactual", "--from", run, "--states", "7"],
         f"rlstab audit: --states 7: --from {run} holds checkpoints of steps 5, 10 only"),
        (["--counterfactual", "--from", run, "--task", "add2"],
         "rlstab audit: --task add2: the --from runs are perm3's; leave --task out"),
        (["--counterfactual", "--from", run, "--lr", "1e-3"],
         "rlstab audit: --lr does not apply with --from (the states are the run's checkpoints); leave it out"),
        (["--counterfactual", "--from", str(tmp_path)],
         f"rlstab audit: --from {tmp_path}: not a lab run's folder (it has no spec.json); give "
         "runs/REGIME/OBJECTIVE/seedN of an rlstab compare --out"),
        (["--counterfactual", "--from", str(bare)],
         f"rlstab audit: --from {bare}: holds no checkpoint; train the run with rlstab compare --keep-checkpoints "
         "(in a new --out: a finished run is not retrained)"),
        (["--counterfactual", "--from", str(broken)],
         f"rlstab audit: --from {broken}: its spec.json is unreadable (KeyError: 'label')"),
        (["--counterfactual", "--objective", "dapo"],
         "rlstab audit: --objective dapo: it has no mask to audit (masks: []); give an objective with one, e.g. stapo"),
    ]


def test_each_bad_input_is_one_line_exit_2_and_nothing_written(run_folder, tmp_path, capsys):
    for argv, line in bad_inputs(run_folder, tmp_path):
        out = tmp_path / "out"
        assert main(["audit", *argv, "--out", str(out)]) == 2, argv
        assert capsys.readouterr().err.splitlines() == [line], argv
        assert not out.exists()
