"""Advantages in a batch take precedence over its rewards; rewards nothing reads are worth one warning.

With both in a batch, the objective's estimator does not run: the loss is the loss of the
advantages alone. Unless a component reads the rewards (``group_filter`` does), a compiled
objective warns once — not on every call — that they are ignored.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import rlstab
from rlstab import TokenBatch

from batches import random_batch


def both() -> tuple[TokenBatch, dict]:
    b = random_batch(B=8, T=6, seed=4, advantages="sequence", rewards=True)
    return b, {f: getattr(b, f) for f in b.__dataclass_fields__}


def caught(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as found:
        warnings.simplefilter("always")
        fn()
    return [w for w in found if issubclass(w.category, UserWarning)]


def test_advantages_take_precedence():
    batch, fields = both()
    loss_fn = rlstab.load("grpo").compile()
    with pytest.warns(UserWarning):
        out = loss_fn(batch)
    advantages_only = TokenBatch(**{**fields, "rewards": None, "group_ids": None})
    rewards_only = TokenBatch(**{**fields, "advantages": None})
    assert torch.equal(out.loss, loss_fn(advantages_only).loss)
    assert not torch.equal(out.loss, loss_fn(rewards_only).loss)  # the estimator would have given another loss


def test_one_warning_per_compiled_objective():
    batch, _ = both()
    loss_fn = rlstab.load("grpo").compile()

    def step():
        stats = loss_fn.gather([batch])
        loss_fn(batch, step=stats)
        loss_fn(batch)

    found = caught(step)
    assert len(found) == 1
    message = str(found[0].message)
    assert message.startswith("objective 'grpo': the batch carries both advantages and rewards; the advantages take precedence")
    assert "the rewards are ignored" in message
    assert found[0].filename == __file__  # it points at the caller's line, not at rlstab
    assert caught(step) == []  # the same objective: already warned
    assert len(caught(lambda: rlstab.load("grpo").compile()(batch))) == 1  # another compiled objective warns again


def test_no_warning_when_a_component_reads_the_rewards():
    batch, _ = both()
    loss_fn = rlstab.load({"extends": "dapo", "group_filter": {"kind": "dynamic_sampling"}}).compile()
    assert caught(lambda: loss_fn(batch)) == []


def test_no_warning_for_advantages_or_rewards_alone():
    _, fields = both()
    loss_fn = rlstab.load("grpo").compile()
    assert caught(lambda: loss_fn(TokenBatch(**{**fields, "rewards": None}))) == []
    assert caught(lambda: loss_fn(TokenBatch(**{**fields, "advantages": None}))) == []
