"""``CompiledObjective.mask_keeps`` and ``mask_silences``: which valid tokens each mask keeps and silences, as the loss counts them."""

import math

import pytest
import torch

import rlstab
from rlstab import BatchError, TokenBatch

from batches import random_batch
from step_worker import take

MASKED = [n for n in rlstab.preset_names() if rlstab.load(n).masks]


def test_by_hand():
    # low_probability silences a token with A > 0 and p < 0.01. Row 0 (reward 1, A > 0): its second token
    # (p = 0.001) is silenced; row 1 (reward 0, A < 0) keeps everything; the padding is kept by nobody.
    loss_fn = rlstab.Objective.model_validate({
        "masks": [{"kind": "low_probability", "tau_p": 0.01}],
        "aggregation": {"kind": "token-mean", "count": "kept"},
    }).compile()
    logprobs = torch.tensor([[-0.1, math.log(1e-3), -0.2], [math.log(1e-3), -0.3, -0.4]])
    batch = TokenBatch(
        logprobs=logprobs, old_logprobs=logprobs, response_mask=torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool),
        rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]),
    )
    keeps = loss_fn.mask_keeps(batch)
    assert list(keeps) == ["low_probability"]
    assert keeps["low_probability"].tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert loss_fn.mask_silences(batch)["low_probability"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    metrics = loss_fn(batch).metrics
    assert metrics["mask/low_probability/kept"] == 4.0 and metrics["mask/low_probability/silenced"] == 1.0


@pytest.mark.parametrize("name", MASKED)
def test_a_steps_keeps_are_what_the_loss_counts(name):
    loss_fn = rlstab.load(name).compile()
    batch = random_batch(B=16, T=12, seed=5)
    micro = [take(batch, lo, hi, batch.logprobs) for lo, hi in ((0, 7), (7, 16))]
    stats = loss_fn.gather(micro)
    for mb in micro:
        keeps = loss_fn.mask_keeps(mb, stats)
        metrics = loss_fn(mb, step=stats).metrics
        assert list(keeps) == loss_fn.mask_labels
        silences = loss_fn.mask_silences(mb, stats)
        for label, keep in keeps.items():
            assert keep.shape == mb.logprobs.shape
            assert float(keep.sum()) == metrics[f"mask/{label}/kept"], label
            assert float(silences[label].sum()) == metrics[f"mask/{label}/silenced"], label
            assert not bool((keep * silences[label]).any()), "a token both kept and silenced"
            assert not bool(keep[~mb.response_mask].any()), "a padding token is kept"
            assert not bool(silences[label][~mb.response_mask].any()), "a padding token is silenced"


@pytest.mark.parametrize("name", MASKED)
def test_without_a_step_the_batch_is_its_own_and_no_state_moves(name):
    loss_fn = rlstab.load(name).compile()
    batch = random_batch(B=16, T=12, seed=6)
    state = loss_fn.state_dict()
    keeps = loss_fn.mask_keeps(batch)
    assert loss_fn.state_dict() == state
    metrics = loss_fn(batch).metrics
    for label, keep in keeps.items():
        assert float(keep.sum()) == metrics[f"mask/{label}/kept"], label


def test_every_mask_keeps_what_trains():
    # A token trains only where every mask keeps it: tokens/kept is the product's count.
    loss_fn = rlstab.load("recipe-2026").compile()
    batch = random_batch(B=16, T=12, seed=7)
    keeps = loss_fn.mask_keeps(batch)
    kept = keeps["s2t"] * keeps["rollout_rejection"]
    assert float(kept.sum()) == loss_fn(batch).metrics["tokens/kept"]


def test_another_objectives_step_is_refused():
    batch = random_batch(B=8, T=6, seed=1)
    stats = rlstab.load("grpo").compile().gather([batch])
    with pytest.raises(BatchError, match="gathered by objective 'grpo'"):
        rlstab.load("stapo").compile().mask_keeps(batch, stats)
