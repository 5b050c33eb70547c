"""The token audit on the tiny model: counts agree with the compiled loss's metrics and with the
mask rules, the table has a row per mask, and ``rlstab audit`` writes its three files."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import rlstab
from rlstab.cli import main
from rlstab.demo.audit import DEFAULT_OBJECTIVES, Sample, audit_objective, collect, sample_from_rollout
from rlstab.demo.audit_report import figure, markdown_table, table_rows
from rlstab.trainer.models import load_policy
from rlstab.trainer.policy import Rollout
from rlstab.trainer.tasks import get_task

WARMUP_STEPS = 6  # toy warm start: a second or two, cached for the module
MASKED_PRESETS = [p for p in rlstab.preset_names() if rlstab.load(p).masks]
# S2T with a large probability threshold, so that the tiny sample has silenced tokens to count.
LOOSE_S2T = {"extends": "stapo", "name": "loose-s2t", "masks": [{"kind": "s2t", "tau_p": 0.5}]}


def main_table(document: str) -> list[str]:
    """The lines of the first Markdown table of ``audit.md``: the audit table."""
    lines = document.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [line for line in lines[start:end] if not line.startswith("|-")]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def task():
    return get_task("add2")


@pytest.fixture(scope="module")
def policy(task, cache_dir):
    return load_policy("tiny", task, seed=0, cache_dir=cache_dir, warm_start_steps=WARMUP_STEPS)


@pytest.fixture(scope="module")
def sample(policy, task):
    s = collect(policy, task, prompts=6, group_size=4, seed=3, model="tiny")
    # A toy warm start rarely answers correctly: give every group mixed rewards, so that advantages
    # are positive on half the responses and the A > 0 masks have something to silence.
    rewards = torch.tensor([1.0, 0.0] * (s.responses // 2))
    return dataclasses.replace(s, rewards=rewards)


def test_collect_is_deterministic_and_well_formed(policy, task):
    a = collect(policy, task, prompts=3, group_size=4, seed=7)
    b = collect(policy, task, prompts=3, group_size=4, seed=7)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
    N, T = a.response_ids.shape
    assert N == 12 and a.response_mask.shape == (N, T) == a.logprobs.shape == a.entropy.shape
    assert a.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert len(a.texts) == N and len(a.problems) == 3
    valid = a.response_mask
    assert (a.logprobs[valid] <= 0).all() and (a.entropy[valid] >= 0).all()
    assert set(a.rewards.tolist()) <= {0.0, 1.0}
    assert a.tokens == int(valid.sum()) > 0
    assert set(a.token_texts) == set(a.response_ids[valid].tolist())


@pytest.mark.parametrize("source", MASKED_PRESETS + ["loose"])
def test_counts_agree_with_the_loss_metrics(sample, source):
    objective = rlstab.load(LOOSE_S2T if source == "loose" else source)
    loss_fn = objective.compile()
    audit = audit_objective(sample, loss_fn, top_k=50)
    assert [m.label for m in audit.masks] == loss_fn.mask_labels
    # The metrics of the compiled loss on the same tensors, computed independently of the audit.
    batch = rlstab.TokenBatch(logprobs=sample.logprobs, response_mask=sample.response_mask,
                              entropy=sample.entropy, rollout_logprobs=sample.rollout_logprobs,
                              rewards=sample.rewards, group_ids=sample.group_ids,
                              is_branch=torch.zeros(sample.responses, dtype=torch.bool) if objective.dual_stream else None,
                              grad_sq_norms=torch.ones(sample.responses) if objective.advantage.kind == "opob" else None,
                              token_ids=sample.response_ids)
    metrics = loss_fn(batch).metrics
    assert audit.kept == metrics["tokens/kept"]
    for m in audit.masks:
        assert m.tokens == sample.tokens == metrics["tokens/valid"]
        assert m.silenced == metrics[f"mask/{m.label}/silenced"]
        assert 0.0 <= m.fraction <= 1.0 and 0.0 <= m.fraction_if_rewarded <= 1.0
        assert m.silenced == int(m.silenced_mask.sum()) == sum(m.counts.values())
        assert not (m.silenced_mask & ~sample.response_mask).any()
        if m.threshold is not None:
            assert math.isclose(m.threshold, metrics[f"mask/{m.label}/entropy_threshold"], rel_tol=1e-6)
        # top-k: sorted by count, shares of the silenced tokens, rates of each token's occurrences
        counts = [c.count for c in m.top]
        assert counts == sorted(counts, reverse=True)
        assert sum(counts) == m.silenced  # top_k=50 covers this tiny vocabulary
        assert all(0 < c.share <= 1 and 0 < c.rate <= 1 for c in m.top)
        for c in m.top:
            occurrences = int((sample.response_ids[sample.response_mask] == c.token_id).sum())
            assert c.rate == pytest.approx(c.count / occurrences)
            assert c.text == sample.token_texts[c.token_id]
        # With every advantage positive, a mask can only silence more of the A > 0 candidates.
        assert m.silenced_if_rewarded >= m.silenced or "entropy_quantile" in m.label


def test_s2t_silences_exactly_its_rule(sample):
    """An independent reading of S2T: A > 0, p < tau_p and H below the step's entropy quantile."""
    audit = audit_objective(sample, rlstab.load(LOOSE_S2T))
    (m,) = audit.masks
    valid = sample.response_mask
    threshold = torch.quantile(sample.entropy[valid].double(), 0.8).float()
    assert m.threshold == pytest.approx(float(threshold), rel=1e-5)
    advantage = rlstab.load("grpo").advantage.apply(
        rlstab.load("grpo").advantage.fit(sample.rewards, sample.group_ids, valid.sum(-1)), sample.rewards,
        sample.group_ids,
    )
    expected = valid & (advantage[:, None] > 0) & (sample.logprobs < math.log(0.5)) & (sample.entropy < threshold)
    assert m.silenced > 0
    assert torch.equal(m.silenced_mask, expected)
    assert len(m.examples) == min(m.silenced, 10)
    for e in m.examples:
        assert expected[e.row, e.position] and e.text == sample.token_texts[int(sample.response_ids[e.row, e.position])]
        assert e.probability < 0.5 and e.entropy < float(threshold) and e.advantage > 0
        assert f"⟦{e.text}⟧" in e.context
    expected_if_rewarded = valid & (sample.logprobs < math.log(0.5)) & (sample.entropy < threshold)
    assert torch.equal(m.silenced_mask_if_rewarded, expected_if_rewarded)
    assert audit.positive_tokens == int(valid[advantage > 0].sum())


def test_table_has_a_row_per_mask(sample):
    audits = [audit_objective(sample, rlstab.load(p), name=p) for p in (*DEFAULT_OBJECTIVES, "20-entropy", "grpo")]
    rows = table_rows(audits)
    assert rows[0][:4] == ["objective", "mask", "silenced", "fraction"]
    assert [r[:2] for r in rows[1:]] == [
        ["stapo", "s2t"], ["stapo-probability-only", "low_probability"], ["stapo-high-entropy", "s2t"],
        ["20-entropy", "entropy_quantile"], ["grpo", "(no mask)"],
    ]
    lines = markdown_table(audits).splitlines()
    assert len(lines) == 2 + 5 and all(line.startswith("| ") for line in lines[2:])
    assert len({len(line) for line in lines}) == 1  # padded: it reads as a plain-text table too
    entropy_row = rows[4]
    assert entropy_row[2].endswith(f"of {sample.tokens:,}")


def test_token_texts_are_escaped_in_the_table():
    ids = torch.tensor([[3, 4, 5]])
    sample = Sample(
        model="m", task="t", problems=[], group_size=1, temperature=1.0, seed=0, response_ids=ids,
        response_mask=torch.ones(1, 3, dtype=torch.bool), logprobs=torch.full((1, 3), -9.0),
        entropy=torch.tensor([[0.1, 0.2, 3.0]]), rewards=torch.tensor([1.0]), group_ids=torch.tensor([0]),
        texts=["a|b`"], token_texts={3: "a|b", 4: "`", 5: "␣c"},
    )
    audit = audit_objective(sample, rlstab.load("stapo-probability-only"), name="p")
    assert audit.masks[0].silenced == 3  # a group of one: GRPO gives A = (1 - 0) / 1 > 0
    table = markdown_table([audit])
    assert "`a\\|b`" in table and "`` ` ``" in table and "`␣c`" in table
    assert len(table.splitlines()[2].split(" | ")) == 9  # the escaped pipe does not split the cell


def test_figure_has_a_panel_per_mask(sample):
    audits = [audit_objective(sample, rlstab.load(p), name=p) for p in DEFAULT_OBJECTIVES]
    fig = figure(audits)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert [t.splitlines()[0] for t in titles] == ["stapo / s2t", "stapo-probability-only / low_probability",
                                                   "stapo-high-entropy / s2t"]


def test_rlstab_audit_writes_table_chart_and_data(tmp_path, cache_dir, capsys):
    args = ["audit", "--prompts", "4", "--group-size", "4", "--seed", "1", "--warmup-steps", str(WARMUP_STEPS),
            "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    document = (tmp_path / "audit.md").read_text()
    rows = main_table(document)
    assert len(rows) == 1 + len(DEFAULT_OBJECTIVES)  # the header and one row per mask
    for name, row in zip(DEFAULT_OBJECTIVES, rows[1:]):
        assert row.split("|")[1].strip() == name
    assert rows[0] in printed and "audit.png" in document

    data = json.loads((tmp_path / "audit.json").read_text())
    assert data["responses"] == 16 and data["prompts"] == 4 and data["group_size"] == 4
    assert [o["name"] for o in data["objectives"]] == list(DEFAULT_OBJECTIVES)
    for o in data["objectives"]:
        (m,) = o["masks"]
        assert m["silenced"] == o["metrics"][f"mask/{m['label']}/silenced"]
        assert m["tokens"] == data["tokens"] == o["metrics"]["tokens/valid"]
        assert 0.0 <= m["fraction"] <= 1.0

    png = (tmp_path / "audit.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_rlstab_audit_takes_several_objectives_and_files(tmp_path, cache_dir, capsys):
    yaml_file = tmp_path / "mine.yaml"
    yaml_file.write_text("extends: stapo\nname: mine\nmasks:\n  - {kind: s2t, tau_p: 0.01}\n")
    args = ["audit", "--prompts", "2", "--group-size", "2", "--warmup-steps", str(WARMUP_STEPS),
            "--cache-dir", str(cache_dir), "--out", str(tmp_path / "out"), "--quiet",
            "--objective", "20-entropy", "--objective", str(yaml_file), "--objective", "grpo"]
    assert main(args) == 0
    rows = main_table((tmp_path / "out" / "audit.md").read_text())
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["20-entropy", "mine", "grpo"]


def test_rlstab_audit_rejects_a_bad_objective(tmp_path, capsys):
    assert main(["audit", "--objective", "no-such-preset", "--out", str(tmp_path)]) == 2
    assert "no-such-preset" in capsys.readouterr().err
    assert not (tmp_path / "audit.md").exists()


def test_rlstab_audit_needs_an_advantage_estimator(tmp_path, cache_dir, capsys):
    yaml_file = tmp_path / "given.yaml"
    yaml_file.write_text("extends: stapo\nname: given\nadvantage: {kind: given}\n")
    args = ["audit", "--prompts", "2", "--group-size", "2", "--warmup-steps", str(WARMUP_STEPS),
            "--cache-dir", str(cache_dir), "--out", str(tmp_path / "out"), "--quiet", "--objective", str(yaml_file)]
    assert main(args) == 2
    assert "advantage estimator" in capsys.readouterr().err


def test_a_trainers_own_rollout_can_be_audited(sample):
    """sample_from_rollout: the tensors of one RL step audit like a collected sample."""
    rollout = Rollout([[0]] * sample.responses, sample.response_ids, sample.response_mask)
    again = sample_from_rollout(rollout, sample.logprobs, sample.entropy, sample.rewards, sample.group_ids,
                                token_texts=sample.token_texts)
    a = audit_objective(sample, rlstab.load("stapo"))
    b = audit_objective(again, rlstab.load("stapo"))
    assert a.metrics == b.metrics and a.masks[0].top == b.masks[0].top


def test_an_objective_with_a_shadow_mask_is_audited_by_its_acting_masks(sample):
    """A shadow mask's count is checked against its own metric (``shadow/<label>/silenced``), and the audit's rows
    are the acting masks': dapo with a shadow S2T has none, the S2T objective itself one."""
    shadow = audit_objective(sample, rlstab.load({"extends": "dapo", "shadow_masks": [{"kind": "s2t", "tau_p": 0.5}]}))
    acting = audit_objective(sample, rlstab.load(LOOSE_S2T))
    assert shadow.masks == [] and shadow.metrics["shadow/s2t/silenced"] == acting.masks[0].silenced
