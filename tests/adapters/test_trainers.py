"""``rlstab validate --trainer`` and ``rlstab explain --trainer``: what each adapter refuses and needs, without its trainer.

The adapters' own start-up checks read the same description (``rlstab.adapters.trainers``); that
they agree preset by preset is tested in each adapter's environment
(``tests/adapters/<trainer>/test_validate_agrees.py``).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import rlstab
from rlstab.adapters import trainers
from rlstab.adapters.placement import batch_fields, placement
from rlstab.adapters.trainer_aggregation import verl_overrides, verl_warning
from rlstab.cli import main
from rlstab.compiler.plan import Plan
from rlstab.explain import explain

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
    readers = list(dict.fromkeys(Plan.of(rlstab.load(name)).readers("rollout_logprobs")))
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
        "tis: GRPOConfig arguments, to paste:",
        "    use_vllm=True,",
        "    vllm_importance_sampling_correction=False,",
    ]
    code, out, _ = cli(capsys, "validate", "--trainer", "OpenRLHF", "stapo", "grpo")  # any case
    assert code == 0 and out == ["stapo: ok with OpenRLHF (stapo)", "grpo: ok with OpenRLHF (grpo)"]


def test_one_bad_file_among_good_ones_fails_the_command_and_every_file_is_answered(capsys):
    code, out, err = cli(capsys, "validate", "--trainer", "verl", "stapo", "tis", "grpo")
    assert code == 1
    assert out == [
        "stapo: ok with veRL (stapo)",
        "stapo: veRL needs actor_rollout_ref.actor.calculate_entropy=True (masks[0] (s2t) reads TokenBatch.entropy)",
        "stapo: veRL overrides (Hydra command line), to paste:",
        "    actor_rollout_ref.actor.calculate_entropy=True \\",
        "grpo: ok with veRL (grpo)",
    ]
    assert len(err) == 1 and err[0].startswith("tis (with veRL): reweighters[0] (tis) reads")


def test_an_unknown_trainer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["validate", "--trainer", "deepspeed", "grpo"])
    assert exit.value.code == 2
    assert "argument --trainer: invalid choice: 'deepspeed' (choose from 'verl', 'openrlhf', 'trl', 'trl-async')" in capsys.readouterr().err


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
    text = explain(rlstab.load("tis"))
    rows = text[text.index("Where each part runs"):].splitlines()
    assert "  loss     reweighters[0] (tis): the compiled loss: embedded, OpenRLHF, TRL, TRL AsyncGRPO; refused by veRL" in rows
    assert "in any trainer" not in text


def test_explain_with_a_trainer_lists_its_refusals_and_settings(capsys):
    code, out, _ = cli(capsys, "explain", "--trainer", "verl", "tis")
    assert code == 1  # as validate --trainer: the adapter would refuse it
    assert "Where each part runs with veRL:" in out
    assert "  loss     reweighters[0] (tis): refused by veRL (below)" in out
    assert out[-2:] == ["veRL refuses:", f"  reweighters[0] (tis) reads TokenBatch.rollout_logprobs: {VERL_ROLLOUT}"]
    code, out, _ = cli(capsys, "explain", "--trainer", "verl", "stapo")
    assert code == 0
    assert out[-5:] == [
        "veRL refuses nothing of it.",
        "veRL needs:",
        "  actor_rollout_ref.actor.calculate_entropy=True (masks[0] (s2t) reads TokenBatch.entropy)",
        "veRL overrides (Hydra command line), to paste:",
        "    actor_rollout_ref.actor.calculate_entropy=True \\",
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
    text = explain(rlstab.load("stapo"))
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
                       "(algorithm.adv_estimator=opo); refused by OpenRLHF, TRL, TRL AsyncGRPO")


# ----------------------------------------------------------------------------- the description itself


def test_each_trainer_is_one_entry_and_its_problems_are_its_refusals():
    assert list(trainers.TRAINERS) == ["verl", "openrlhf", "trl", "trl-async"]
    assert trainers.trainer("veRL") is trainers.VERL
    with pytest.raises(ValueError, match="trainer 'x': allowed verl, openrlhf, trl, trl-async"):
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
    for trainer in ("verl", "trl", "trl-async", "openrlhf"):
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


# ----------------------------------------------------------------------------- issue 38: what to paste, and why


@pytest.mark.parametrize("key", list(trainers.TRAINERS))
@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_override_to_paste_is_in_the_trainers_own_syntax_and_comes_from_a_setting(name, key):
    """veRL: Hydra ``key=value``; OpenRLHF: ``--flag value...``; TRL: ``GRPOConfig`` keyword = a Python literal."""
    objective = rlstab.load(name)
    needed = trainers.needed(objective, key)
    assert [s.line() for s in needed] == trainers.settings(objective, key)
    pasted = trainers.overrides(objective, key)
    assert pasted == list(dict.fromkeys(o for s in needed for o in s.overrides))
    block = trainers.paste_block(objective, key)
    assert block == ([] if not pasted else [block[0], *(f"    {trainers.trainer(key).paste[1].format(o)}" for o in pasted)])
    for override in pasted:
        if key == "verl":
            assert re.fullmatch(r"[a-z_][\w.]*=[^\s=]+", override), override
        elif key == "openrlhf":
            assert re.fullmatch(r"--[a-z_.]+( [\w.-]+)+", override), override
        else:
            field, _, value = override.partition("=")
            assert field.isidentifier() and ast.literal_eval(value) is not None, override


def test_verls_aggregation_against_its_settings():
    """Hand cases of verl_overrides: what to set from the given loss_agg_mode / loss_scale_factor."""
    def agg(**fields):
        return rlstab.load({"extends": "grpo", "aggregation": {"count": "valid", **fields}}).aggregation

    actor = "actor_rollout_ref.actor"
    assert verl_overrides(agg(kind="token-mean")) == []  # veRL's default
    assert verl_overrides(agg(kind="seq-mean-token-mean")) == [f"{actor}.loss_agg_mode=seq-mean-token-mean"]
    assert verl_overrides(agg(kind="seq-mean-token-mean"), "seq-mean-token-mean", 37) == []  # the factor: norm only
    assert verl_overrides(agg(kind="seq-mean-token-sum-norm")) == [f"{actor}.loss_agg_mode=seq-mean-token-sum-norm"]
    assert verl_overrides(agg(kind="seq-mean-token-sum-norm", norm=4096), "seq-mean-token-sum-norm") == [
        f"{actor}.loss_scale_factor=4096"]
    assert verl_overrides(agg(kind="seq-mean-token-sum-norm"), "seq-mean-token-sum-norm", 4096) == [
        f"{actor}.loss_scale_factor=null"]  # max_length is veRL's null
    assert verl_overrides(SimpleNamespace(kind="a-plugins-kind")) is None  # no loss_agg_mode aggregates as it does
    assert verl_warning(agg(kind="token-mean"), "token-mean", 4096) is None
    assert verl_warning(SimpleNamespace(kind="a-plugins-kind"), "token-mean", None).endswith(
        f"{actor}.loss_agg_mode=token-mean (veRL's default); no loss_agg_mode aggregates as it does")
    assert verl_warning(agg(kind="token-sum"), "seq-mean-token-sum-norm", 8) == (
        "the objective aggregates the policy loss with token-sum, but veRL aggregates its entropy bonus (entropy_coeff), "
        f"its KL loss (use_kl_loss) and its actor/entropy metric with {actor}.loss_agg_mode=seq-mean-token-sum-norm "
        f"with loss_scale_factor=8; set {actor}.loss_agg_mode=token-sum to aggregate them as the policy loss, or change "
        "aggregation in the objective")


CORRECTION = ["--algo.advantage.is_correction_level", "token"]
NEUTRAL = ["--algo.advantage.is_correction_mode", "clip", "--algo.advantage.is_correction_threshold", "1", "1"]


@pytest.mark.parametrize(("name", "argv", "warned"), [
    ("tis", CORRECTION, True),  # OpenRLHF's default mode mask [0.5, 5] on top of tis
    ("tis", [*CORRECTION, *NEUTRAL], False),
    ("tis", ["--algo.advantage.is_correction_level=token", *NEUTRAL, "--actor.dual_clip", "3"], False),
    ("tis", [*CORRECTION, "--algo.advantage.is_correction_mode", "clip"], True),  # clip into [0.5, 5] still weighs
    ("tis", [], False),  # no correction: the launcher refuses tis instead (no rollout log-probabilities)
    ("tis", [*CORRECTION, "--algo.advantage.is_correction_threshold", "x", "1"], False),  # OpenRLHF's parser says so
    ("icepop", ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "0.03"], True),
    ("grpo", CORRECTION, False),  # corrects nothing itself: OpenRLHF's correction is the only one
])
def test_the_openrlhf_launcher_and_loss_warn_when_openrlhfs_coefficient_would_correct_a_second_time(name, argv, warned):
    """One text for validate, the launcher (from OpenRLHF's arguments) and RlstabPolicyLoss (from its own)."""
    from rlstab.adapters.openrlhf.config import correction_settings, double_correction

    note = double_correction(rlstab.load(name), *correction_settings(argv))
    assert (note is not None) == warned
    if name == "tis" and warned and len(argv) == 2:
        assert note == (
            "--algo.advantage.is_correction_level token with --algo.advantage.is_correction_mode mask and "
            "--algo.advantage.is_correction_threshold 0.5 5: " + trainers.openrlhf_double_correction(["reweighters[0] (tis)"])
            + "; set --algo.advantage.is_correction_mode clip --algo.advantage.is_correction_threshold 1 1")
    if name == "icepop":  # clip mode is OpenRLHF's at token level only
        assert note.endswith("; set --algo.advantage.is_correction_level token --algo.advantage.is_correction_mode "
                             "clip --algo.advantage.is_correction_threshold 1 1")


def test_openrlhfs_coefficient_is_1_with_the_flags_validate_names():
    """The adapter applies OpenRLHF's coefficient as OpenRLHF 0.11.2 does (is_correction.py): clip into [1, 1] is 1.

    (OpenRLHF's own PolicyLoss gives the same loss with these flags as without any correction; tried with its 0.11.2
    wheel, and its conformance with the adapter is tests/adapters/openrlhf/test_conformance.py.)
    """
    import torch

    from rlstab.adapters.openrlhf.is_correction import ISCorrection

    g = torch.Generator().manual_seed(0)
    old, rollout = -torch.rand(3, 5, generator=g) * 3, -torch.rand(3, 5, generator=g) * 3
    mask = torch.ones(3, 5, dtype=torch.bool)
    coefficient, _, filtered = ISCorrection("token", "clip", "ratio", 1.0, 1.0).weights(old, rollout, mask)
    assert torch.equal(coefficient, torch.ones(3, 5))
    assert filtered.item() == 1.0  # every ratio differs from 1: OpenRLHF's is_filter_ratio says so
    default, _, _ = ISCorrection("token", "mask", "ratio", 0.5, 5.0).weights(old, rollout, mask)
    assert not torch.equal(default, torch.ones(3, 5))  # OpenRLHF's default mode does weigh each token
