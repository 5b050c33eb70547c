"""Truncated importance sampling, token and sequence level, hand-computed."""

import pytest
import torch

import rlstab

MASK = torch.tensor([[True, True], [True, True]])
# Trainer (old) and inference-engine probabilities of each sampled token.
OLD = torch.tensor([[0.5, 0.5], [0.5, 0.2]])
ROLLOUT = torch.tensor([[0.4, 0.1], [0.5, 0.25]])


def loss(level, cap=2.0):
    objective = rlstab.load({
        "reweighters": [{"kind": "tis", "level": level, "cap": cap}],
        "surrogate": {"kind": "none"},
        "aggregation": {"kind": "token-sum", "count": "valid"},
    })
    batch = rlstab.TokenBatch(
        logprobs=OLD.log(), old_logprobs=OLD.log(), rollout_logprobs=ROLLOUT.log(),
        advantages=torch.ones(2), response_mask=MASK,
    )
    return objective.compile()(batch).loss.item()


def test_token_level():
    # ratios 0.5/0.4 = 1.25, 0.5/0.1 = 5 -> 2 (cap), 1, 0.2/0.25 = 0.8; l = -A r w with r = 1:
    # token-sum = -(1.25 + 2 + 1 + 0.8) = -5.05
    assert loss("token") == pytest.approx(-5.05)


def test_sequence_level():
    # row 0: 1.25 * 5 = 6.25 -> 2 on both tokens; row 1: 1 * 0.8 = 0.8 on both: -(2 * 2 + 2 * 0.8) = -5.6
    assert loss("sequence") == pytest.approx(-5.6)


def test_null_cap_leaves_the_ratio_untruncated():
    # token: -(1.25 + 5 + 1 + 0.8) = -8.05; sequence: row 0 6.25 on both tokens, row 1 0.8: -(12.5 + 1.6) = -14.1
    assert loss("token", cap=None) == pytest.approx(-8.05)
    assert loss("sequence", cap=None) == pytest.approx(-14.1)
    objective = rlstab.load({"extends": "grpo", "reweighters": [{"kind": "tis", "cap": None}]})
    assert objective.reweighters[0].describe() == "tis (token): w = pi_train(old)/pi_infer(old)"
    assert rlstab.load(objective.to_yaml()) == objective  # the null survives the YAML (the default is 2)


def test_needs_rollout_logprobs():
    objective = rlstab.load({"reweighters": [{"kind": "tis"}], "aggregation": {"kind": "token-mean", "count": "valid"}})
    batch = rlstab.TokenBatch(logprobs=OLD.log(), advantages=torch.ones(2), response_mask=MASK)
    with pytest.raises(rlstab.BatchError, match=r"reweighters\[0\] \(tis\) reads TokenBatch\.rollout_logprobs"):
        objective.compile()(batch)


def test_floor_clamps_from_below():
    """TRL's ``*_truncate`` modes with vllm_importance_sampling_clip_min: clip(ratio, C_min, C_max)."""
    objective = rlstab.load({
        "reweighters": [{"kind": "tis", "level": "token", "cap": 2.0, "floor": 0.9}],
        "surrogate": {"kind": "none"},
        "aggregation": {"kind": "token-sum", "count": "valid"},
    })
    batch = rlstab.TokenBatch(
        logprobs=OLD.log(), old_logprobs=OLD.log(), rollout_logprobs=ROLLOUT.log(),
        advantages=torch.ones(2), response_mask=MASK,
    )
    # ratios 1.25, 5 -> 2 (cap), 1, 0.8 -> 0.9 (floor): -(1.25 + 2 + 1 + 0.9) = -5.15
    assert objective.compile()(batch).loss.item() == pytest.approx(-5.15)
    assert "clip(" in objective.reweighters[0].describe()


def test_floor_above_cap_is_refused():
    with pytest.raises(rlstab.ConfigError, match="floor"):
        rlstab.load({"reweighters": [{"kind": "tis", "cap": 2.0, "floor": 3.0}]})
