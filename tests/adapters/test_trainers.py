"""``rlstab validate --trainer`` and ``rlstab explain --trainer``: what each adapter refuses and needs, without its trainer.

The adapters' own start-up checks read the same description (``rlstab.adapters.trainers``); that
they agree preset by preset is tested in each adapter's environment
(``tests/adapters/<trainer>/test_validate_agrees.py``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import rlstab
from rlstab.adapters import trainers
from rlstab.adapters.placement import batch_fields, placement
from rlstab.cli import main

VERL_ROLLOUT = (
    "veRL applies its rollout correction in the driver (algorithm.rollout_correction) and passes the resulting "
    "rollout_is_weights, which rlstab applies"
)


def cli(capsys, *args: str) -> tuple[int, list[str], list[str]]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


# ----------------------------------------------------------------------------- the cases


@pytest.mark.parametrize("name", ["tis", "icepop", "recipe-2026"])
def test_verl_refuses_what_reads_rollout_logprobs_one_line_each(capsys, name):
    readers = list(dict.fromkeys(rlstab.load(name).plan().readers("rollout_logprobs")))
    code, out, err = cli(capsys, "validate", "--trainer", "verl", name)
    assert code == 1 and out == []
    assert err == [f"{name} (with veRL): {who} reads TokenBatch.rollout_logprobs: {VERL_ROLLOUT}" for who in readers]


@pytest.mark.parametrize("field", ["rewards", "group_ids"])
def test_verl_refuses_a_component_reading_rewards_or_groups(tmp_path, capsys, field):
    (tmp_path / "f.yaml").write_text("extends: dapo\nname: f\ngroup_filter: {kind: dynamic_sampling}\n")
    code, _, err = cli(capsys, "validate", "--trainer", "verl", str(tmp_path / "f.yaml"))
    assert code == 1
    assert any(line.startswith(f"{tmp_path / 'f.yaml'} (with veRL): group_filter (dynamic_sampling) reads "
                               f"TokenBatch.{field}: ") for line in err)


def test_the_same_objective_passes_where_the_trainer_supplies_it_and_says_what_to_set(capsys):
    code, out, err = cli(capsys, "validate", "--trainer", "trl", "tis")
    assert (code, err) == (0, [])
    assert out == [
        "tis: ok with TRL (tis)",
        "tis: TRL needs use_vllm=True and vllm_importance_sampling_correction=False "
        "(reweighters[0] (tis) reads TokenBatch.rollout_logprobs)",
    ]
    code, out, _ = cli(capsys, "validate", "--trainer", "OpenRLHF", "stapo", "grpo")  # any case
    assert code == 0 and out == ["stapo: ok with OpenRLHF (stapo)", "grpo: ok with OpenRLHF (grpo)"]


def test_one_bad_file_among_good_ones_fails_the_command_and_every_file_is_answered(capsys):
    code, out, err = cli(capsys, "validate", "--trainer", "verl", "stapo", "tis", "grpo")
    assert code == 1
    assert out == [
        "stapo: ok with veRL (stapo)",
        "stapo: veRL needs actor_rollout_ref.actor.calculate_entropy=True (masks[0] (s2t) reads TokenBatch.entropy)",
        "grpo: ok with veRL (grpo)",
    ]
    assert len(err) == 1 and err[0].startswith("tis (with veRL): reweighters[0] (tis) reads")


def test_an_unknown_trainer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["validate", "--trainer", "deepspeed", "grpo"])
    assert exit.value.code == 2
    assert "argument --trainer: invalid choice: 'deepspeed' (choose from 'verl', 'openrlhf', 'trl')" in capsys.readouterr().err


def test_a_file_that_does_not_load_is_reported_as_without_trainer(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("extends: stapo\nmasks:\n  - {kind: s2t, tau_p: 1.5}\n")
    code, out, err = cli(capsys, "validate", "--trainer", "verl", str(tmp_path / "bad.yaml"))
    assert code == 1 and out == [] and len(err) == 1 and "masks[0].tau_p = 1.5" in err[0]


def test_the_yaml_pages_block_is_what_validate_prints(capsys):
    """docs/yaml.md shows both commands with their output (stdout, then stderr), and the first one's status 1."""
    page = (Path(__file__).parents[2] / "docs" / "yaml.md").read_text()
    start = page.index("$ rlstab validate --trainer verl stapo tis\n")
    block = page[start:page.index("```", start)].splitlines()
    second = block.index("$ rlstab validate --trainer trl tis")
    for command, shown, status in ((block[0], block[1:second], 1), (block[second], block[second + 1:], 0)):
        code, out, err = cli(capsys, *shlex.split(command[2:])[1:])
        assert (code, out + err) == (status, shown)


# ----------------------------------------------------------------------------- explain


def test_explain_tis_no_longer_claims_verl_runs_its_reweighter():
    text = rlstab.load("tis").explain()
    rows = text[text.index("Where each part runs"):].splitlines()
    assert "  loss     reweighters[0] (tis): the compiled loss: embedded, OpenRLHF, TRL; refused by veRL" in rows
    assert "in any trainer" not in text


def test_explain_with_a_trainer_lists_its_refusals_and_settings(capsys):
    code, out, _ = cli(capsys, "explain", "--trainer", "verl", "tis")
    assert code == 1  # as validate --trainer: the adapter would refuse it
    assert "Where each part runs with veRL:" in out
    assert "  loss     reweighters[0] (tis): refused by veRL (below)" in out
    assert out[-2:] == ["veRL refuses:", f"  reweighters[0] (tis) reads TokenBatch.rollout_logprobs: {VERL_ROLLOUT}"]
    code, out, _ = cli(capsys, "explain", "--trainer", "verl", "stapo")
    assert code == 0
    assert out[-3:] == [
        "veRL refuses nothing of it.",
        "veRL needs:",
        "  actor_rollout_ref.actor.calculate_entropy=True (masks[0] (s2t) reads TokenBatch.entropy)",
    ]


def test_explain_lists_the_batch_fields_the_objective_reads():
    assert batch_fields(rlstab.load("recipe-2026"))[1:] == [
        "entropy: masks[0] (s2t)",
        "rollout_logprobs: masks[1] (rollout_rejection), reweighters[0] (tis)",
        "group_ids, rewards: advantage (grpo), only for a batch without advantages",
    ]
    assert batch_fields(rlstab.load("four_layers"))[-1] == (
        "grad_sq_norms, group_ids, rewards, rollout_logprobs: advantage (opob), only for a batch without advantages"
    )
    text = rlstab.load("stapo").explain()
    assert "Batch fields it reads (TokenBatch):\n  logprobs, response_mask, old_logprobs, advantages: " in text
    assert "\n  entropy: masks[0] (s2t)\n" in text


def _rows(name: str, trainer: str | None = None) -> list[tuple[str, str, str]]:
    return placement(rlstab.load(name), trainer)


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_explain_never_claims_a_trainer_runs_what_its_adapter_refuses(name):
    """For every preset: each refused part is on a row that names its refusing trainers and not as running it."""
    objective = rlstab.load(name)
    rows = _rows(name)
    for t in trainers.TRAINERS.values():
        refused = {part for part, _ in trainers.refusals(objective, t.key)}
        for part in refused:
            (row,) = [r for r in rows if part in r[1].split(", ") or r[1] == part.split(" (")[-1].rstrip(")")]
            runners, _, refusers = row[2].rpartition(": ")[2].partition("; refused by ")
            assert t.name in refusers.split(", ") and t.name not in runners, (part, row)
        for _layer, parts, where in placement(objective, t.key):
            named = [p for p in refused if p in parts.split(", ") or parts == p.split(" (")[-1].rstrip(")")]
            assert where.startswith(f"refused by {t.name}") == bool(named), (t.key, parts, where)


def test_opo_runs_in_verls_driver_and_nowhere_else_among_the_adapters():
    rows = placement(rlstab.load({"extends": "grpo", "advantage": {"kind": "opo"}}))
    assert rows[1] == ("step", "advantage (opo)", "the estimator: embedded; veRL computes it in its driver "
                       "(algorithm.adv_estimator=opo); refused by OpenRLHF, TRL")


# ----------------------------------------------------------------------------- the description itself


def test_each_trainer_is_one_entry_and_its_problems_are_its_refusals():
    assert list(trainers.TRAINERS) == ["verl", "openrlhf", "trl"]
    assert trainers.trainer("veRL") is trainers.VERL
    with pytest.raises(ValueError, match="trainer 'x': allowed verl, openrlhf, trl"):
        trainers.trainer("x")
    objective = rlstab.load({"extends": "grpo", "aggregation": {"kind": "token-sum", "count": "valid"}})
    assert trainers.refusals(objective, "openrlhf") == [("aggregation (token-sum)", (
        "aggregation.kind = 'token-sum': not available in OpenRLHF; DeepSpeed divides every micro-batch loss by the "
        "gradient-accumulation steps, which the loss cannot see. Use token-mean or a seq-mean-* aggregation"))]
    assert trainers.problems(objective, "verl") == trainers.problems(objective, "trl") == []


def test_validate_and_explain_with_a_trainer_import_neither_torch_nor_the_trainer():
    code = """
import contextlib, io, json, sys
import rlstab
from rlstab.cli import main

names = rlstab.preset_names()
codes = []
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for trainer in ("verl", "trl", "openrlhf"):
        codes.append(main(["validate", "--trainer", trainer, *names]))
        codes += [main(["explain", "--trainer", trainer, name]) for name in names]
heavy = ("torch", "verl", "trl", "openrlhf", "ray", "transformers", "deepspeed")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps({"codes": codes, "loaded": loaded}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert set(report["codes"]) == {0, 1}  # some presets pass, some are refused
