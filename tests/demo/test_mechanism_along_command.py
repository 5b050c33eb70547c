"""``rlstab audit --mechanism --from``: from a lab run's kept checkpoints it writes mechanism.json and audit.md (a state
where the mask silences nothing is reported as uninformative and left out of the combination); every bad input is one
line and exit status 2 with nothing written."""

from __future__ import annotations

import json

from rlstab.cli import main
from rlstab.trainer.config import TrainConfig

SMALL = ["--prompts", "2", "--group-size", "2", "--quiet"]


def test_from_a_lab_runs_checkpoints_it_writes_its_json_and_tables(run_folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["audit", "--mechanism", "--from", str(run_folder), *SMALL, "--out", str(out)]) == 0
    data = json.loads((out / "mechanism.json").read_text())
    assert data["source"]["kind"] == "lab" and data["objective"] == "stapo" and data["settings"]["null_draws"] == 50
    # an untrained model answers no perm3 problem right: every advantage is 0, S2T silences nothing in either state
    assert [(s["label"], s["step"], s["silenced"], s["informative"]) for s in data["states"]] == [
        ("seed0/step5", 5, 0, False), ("seed0/step10", 10, 0, False)]
    assert {s["temperature"] for s in data["states"]} == {TrainConfig.model_fields["temperature"].default}  # the regime's
    assert data["states"][0]["batch_seed"] != data["states"][1]["batch_seed"]
    assert data["combined"]["informative_states"] == 0
    assert data["combined"]["uninformative_states"] == ["seed0/step5", "seed0/step10"]
    assert data["combined"]["null_a"] == {"states": 0, "fisher": None, "p": None}
    document = (out / "audit.md").read_text()
    assert document.startswith("# Mechanism along training: tiny on perm3, objective stapo")
    tokens = data["states"][1]["tokens"]
    assert (f"| dapo/seed0 | 10 | {tokens} | 0 | 0 | 0 | uninformative: m = 0: the mask silenced no token | "
            + " | ".join(["—"] * 7) + " |") in document
    assert "- null A (random positive-advantage tokens): no informative state; 2 uninformative, left out " \
           "(seed0/step5, seed0/step10)" in document
    assert "## Correlation with entropy at fixed probability" in document and "| pooled | all |" in document
    assert capsys.readouterr().out.startswith("# Mechanism along training")


def test_a_given_temperature_overrides_the_regimes(run_folder, tmp_path):
    out = tmp_path / "out"
    assert main(["audit", "--mechanism", "--from", str(run_folder), "--states", "5", "--temperature", "1.5", *SMALL,
                 "--out", str(out)]) == 0
    (state,) = json.loads((out / "mechanism.json").read_text())["states"]
    assert (state["step"], state["temperature"]) == (5, 1.5)


def test_each_bad_input_is_one_line_exit_2_and_nothing_written(run_folder, tmp_path, capsys):
    run = str(run_folder)
    bad = [
        (["--mechanism", "--null-draws", "50"],
         "rlstab audit: --null-draws needs --from with --mechanism (the one-sample --mechanism draws no null)"),
        (["--mechanism", "--states", "5"], "rlstab audit: --states 5 needs --from (the steps of a lab run's checkpoints)"),
        (["--null-draws", "50"], "rlstab audit: --null-draws applies to --counterfactual or --mechanism only; leave it out"),
        (["--mechanism", "--from", run, "--null-draws", "10"],
         "rlstab audit: --null-draws 10: must be an integer from 50 to 10,000"),
        (["--mechanism", "--from", run, "--held-out", "4"],
         "rlstab audit: --held-out applies to --counterfactual only; leave it out"),
        (["--mechanism", "--from", run, "--lr", "1e-3"], "rlstab audit: --lr applies to --counterfactual only; leave it out"),
        (["--mechanism", "--from", run, "--top-k", "3"],
         "rlstab audit: --top-k applies to the token audit, not to --mechanism --from; leave it out"),
        (["--mechanism", "--from", run, "--objective", "stapo", "--objective", "stapo-dose"],
         "rlstab audit: --mechanism --from audits one objective's mask; give --objective once (got 2)"),
        (["--mechanism", "--from", run, "--warmup-steps", "3"],
         "rlstab audit: --warmup-steps does not apply with --from (the states are the run's checkpoints); leave it out"),
        (["--mechanism", "--from", run, "--states", "7"],
         f"rlstab audit: --states 7: --from {run} holds checkpoints of steps 5, 10 only"),
        (["--mechanism", "--from", run, "--states", "5,x"],
         "rlstab audit: --states 5,x: give checkpoint steps as whole numbers of at least 1, separated by commas (5,10,20)"),
        (["--mechanism", "--from", run, "--task", "add2"],
         "rlstab audit: --task add2: the --from runs are perm3's; leave --task out"),
        (["--mechanism", "--from", str(tmp_path)],
         f"rlstab audit: --from {tmp_path}: not a lab run's folder (it has no spec.json); give "
         "runs/REGIME/OBJECTIVE/seedN of an rlstab compare --out"),
        (["--mechanism", "--from", run, "--objective", "dapo"],
         "rlstab audit: --objective dapo: it has no mask to audit (masks: []); give an objective with one, e.g. stapo"),
    ]
    for argv, line in bad:
        out = tmp_path / "out"
        assert main(["audit", *argv, "--out", str(out)]) == 2, argv
        assert capsys.readouterr().err.splitlines() == [line], argv
        assert not out.exists()
