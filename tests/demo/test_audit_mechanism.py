"""``rlstab audit --mechanism`` on the tiny model: gradient shares of each mask's silenced tokens (0 for a mask
silencing nothing, 1 for one silencing everything, shadow masks included) and the p/H logit-gradient bins."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import rlstab
from rlstab.cli import main
from rlstab.demo.audit import audit_mechanism, collect
from rlstab.trainer.models import load_policy
from rlstab.trainer.tasks import get_task

WARMUP_STEPS = 6  # toy warm start, as test_audit.py
EVERYTHING_AND_NOTHING = {
    "extends": "grpo", "name": "all-and-none",
    "masks": [{"kind": "expression", "silence": "position >= 0"}, {"kind": "expression", "keep": "position >= 0"}],
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def policy(cache_dir):
    return load_policy("tiny", get_task("add2"), seed=0, cache_dir=cache_dir, warm_start_steps=WARMUP_STEPS)


@pytest.fixture(scope="module")
def sample(policy):
    s = collect(policy, get_task("add2"), prompts=4, group_size=4, seed=3, model="tiny")
    return dataclasses.replace(s, rewards=torch.tensor([1.0, 0.0] * (s.responses // 2)))  # mixed groups


def test_silencing_nothing_shares_0_and_everything_1(sample, policy):
    out = audit_mechanism(sample, policy, rlstab.load(EVERYTHING_AND_NOTHING), micro_batch=5)
    assert out["space"] == "parameters" and out["full_grad_norm"] > 0
    everything, nothing = out["masks"]["expression_0"], out["masks"]["expression_1"]
    assert everything["silenced"] == sample.tokens and everything["share"] == 1.0
    assert everything["cosine"] == pytest.approx(1.0)
    assert nothing == {"share": 0.0, "cosine": None, "silenced": 0}
    assert out["logit_grad"]["tokens"] == sample.tokens
    assert sum(b["count"] for b in out["logit_grad"]["probability_bins"]) == sample.tokens
    assert sum(b["count"] for b in out["logit_grad"]["entropy_bins"]) == sample.tokens


def test_the_micro_batch_split_changes_nothing(sample, policy):
    loose = {"extends": "stapo", "name": "loose", "masks": [{"kind": "s2t", "tau_p": 0.5}]}
    whole = audit_mechanism(sample, policy, rlstab.load(loose), micro_batch=64)
    split = audit_mechanism(sample, policy, rlstab.load(loose), micro_batch=3)
    assert whole["masks"]["s2t"]["silenced"] == split["masks"]["s2t"]["silenced"] > 0
    assert split["masks"]["s2t"]["share"] == pytest.approx(whole["masks"]["s2t"]["share"], rel=1e-4)
    assert split["full_grad_norm"] == pytest.approx(whole["full_grad_norm"], rel=1e-4)


def test_a_shadow_mask_is_measured_while_it_does_not_act(sample, policy):
    shadowed = {"extends": "dapo", "name": "dapo-shadow", "shadow_masks": [{"kind": "expression", "silence": "position >= 0"}]}
    out = audit_mechanism(sample, policy, rlstab.load(shadowed))
    (label,) = out["masks"]
    assert label.startswith("shadow/")
    assert out["masks"][label]["share"] == 1.0 and out["masks"][label]["silenced"] == sample.tokens
    # The shadow mask does not act: the full gradient is dapo's own.
    assert out["full_grad_norm"] == pytest.approx(audit_mechanism(sample, policy, rlstab.load("dapo"))["full_grad_norm"])


def test_rlstab_audit_mechanism_writes_its_section_and_data(tmp_path, cache_dir, capsys):
    base = ["audit", "--prompts", "3", "--group-size", "4", "--warmup-steps", str(WARMUP_STEPS),
            "--cache-dir", str(cache_dir), "--quiet", "--objective", "stapo", "--objective", "grpo"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    assert main([*base, "--out", str(tmp_path / "measured"), "--mechanism"]) == 0
    capsys.readouterr()
    plain, measured = (tmp_path / "plain" / "audit.md").read_text(), (tmp_path / "measured" / "audit.md").read_text()
    assert "## Mechanism" not in plain and "## Mechanism" in measured
    assert measured.startswith(plain.rstrip("\n"))  # the section is added after the audit, which is unchanged
    assert "| stapo | s2t |" in measured and "| grpo | (no mask) |" in measured
    data = json.loads((tmp_path / "measured" / "audit.json").read_text())
    assert [set(o["mechanism"]) for o in data["objectives"]] == [{"space", "full_grad_norm", "masks", "logit_grad"}] * 2
    assert all("mechanism" not in o for o in json.loads((tmp_path / "plain" / "audit.json").read_text())["objectives"])
