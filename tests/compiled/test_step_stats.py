"""StepStats belong to the objective that gathered them; an empty step has one behaviour for every objective.

- A ``StepStats`` carries the fingerprint of its objective: the loss of another objective refuses
  it (it used to zip the statistics with its own masks and silently drop what did not fit, e.g.
  ``stapo`` with ``grpo``'s statistics trained without its S2T mask).
- ``gather([])`` in one process: empty statistics for every preset, and the state moves as for a
  step without tokens. Under ``torch.distributed`` it is refused before any collective (the other
  ranks would wait forever); an empty micro-batch (B = 0) is what a rank without data passes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

import rlstab
from rlstab import BatchError, StepStats, TokenBatch
from rlstab.aggregation import StepCounts

from batches import random_batch, with_trainer_fields

PRESETS = rlstab.preset_names()


# ----------------------------------------------------------------------------- identity


def test_another_objectives_statistics_are_refused():
    batch = random_batch(B=8, T=12, seed=2, advantages="sequence")
    stats = rlstab.load("grpo").compile().gather([batch])
    with pytest.raises(BatchError) as info:
        rlstab.load("stapo").compile()(batch, step=stats)
    assert str(info.value).startswith("these StepStats were gathered by objective 'grpo', not by this one ('stapo')")


def test_objectives_of_the_same_shape_are_told_apart():
    """stapo and stapo-high-entropy have the same components (one mask, no hooks): only the fingerprint differs."""
    batch = random_batch(B=8, T=12, seed=2, advantages="sequence")
    stats = rlstab.load("stapo-high-entropy").compile().gather([batch])
    with pytest.raises(BatchError, match="gathered by objective 'stapo-high-entropy', not by this one"):
        rlstab.load("stapo").compile()(batch, step=stats)


def test_the_same_objective_compiled_twice_shares_statistics():
    batch = random_batch(B=8, T=12, seed=2, advantages="sequence")
    first, second = rlstab.load("stapo").compile(), rlstab.load("stapo").compile()
    stats = first.gather([batch])
    assert first.fingerprint == second.fingerprint == stats.fingerprint
    assert torch.equal(second(batch, step=stats).loss, first(batch, step=stats).loss)


def test_a_renamed_copy_computes_the_same_and_shares_statistics():
    batch = random_batch(B=8, T=12, seed=2, advantages="sequence")
    renamed = rlstab.load({"extends": "stapo", "name": "mine", "description": "the same loss"}).compile()
    stats = rlstab.load("stapo").compile().gather([batch])
    assert torch.equal(renamed(batch, step=stats).loss, rlstab.load("stapo").compile()(batch).loss)


def test_adapters_replacing_the_counts_keep_the_identity():
    """The adapters swap in trainer-wide counts with dataclasses.replace: the fingerprint stays."""
    batch = random_batch(B=8, T=12, seed=2, advantages="sequence")
    loss_fn = rlstab.load("stapo").compile()
    stats = loss_fn.gather([batch])
    wider = dataclasses.replace(stats, counts=dataclasses.replace(stats.counts, tokens_valid=1000.0))
    assert torch.isfinite(loss_fn(batch, step=wider).loss)


def test_hand_built_statistics_are_refused():
    batch = random_batch(B=8, T=12, seed=2, advantages="sequence")
    stats = StepStats(StepCounts(10.0, 10.0, 8.0, 8.0, max_length=12, world_size=1), (None,), None)
    with pytest.raises(BatchError, match=r"gathered by no objective's gather, not by this one \('stapo'\)"):
        rlstab.load("stapo").compile()(batch, step=stats)
    with pytest.raises(BatchError, match="step must be the StepStats that gather returned, got dict"):
        rlstab.load("stapo").compile()(batch, step={"counts": None})


def test_every_preset_has_its_own_fingerprint():
    fingerprints = {rlstab.load(name).fingerprint() for name in PRESETS}
    assert len(fingerprints) == len(PRESETS)


# ----------------------------------------------------------------------------- empty steps


def empty_batch(T: int = 4, advantages: bool = True) -> TokenBatch:
    fields = dict(
        logprobs=torch.zeros(0, T, requires_grad=True),
        response_mask=torch.zeros(0, T, dtype=torch.bool),
        old_logprobs=torch.zeros(0, T),
        entropy=torch.zeros(0, T, requires_grad=True),  # as a trainer gives it to an entropy bonus
        rollout_logprobs=torch.zeros(0, T),
        ref_logprobs=torch.zeros(0, T),
    )
    if advantages:
        fields["advantages"] = torch.zeros(0)
    else:
        fields.update(rewards=torch.zeros(0), group_ids=torch.zeros(0, dtype=torch.int64))
    return TokenBatch(**fields)


@pytest.mark.parametrize("name", PRESETS)
def test_gather_of_no_micro_batch_is_an_empty_step(name):
    loss_fn = rlstab.load(name).compile()
    before = loss_fn.state_dict()
    stats = loss_fn.gather([])
    assert (stats.counts.tokens_valid, stats.counts.tokens_kept) == (0, 0)
    assert (stats.counts.sequences_valid, stats.counts.sequences_kept, stats.counts.max_length) == (0, 0, 0)
    assert all(t is None for t in stats.thresholds) and stats.advantage is None
    # the state moves as for a step whose only micro-batch is empty
    reference = rlstab.load(name).compile()
    reference.gather([with_trainer_fields(reference.objective, empty_batch())])
    assert loss_fn.state_dict() == reference.state_dict()
    if name == "stare":  # a step without valid tokens leaves STARE's controller as it was
        assert loss_fn.state_dict() == before
    if name == "bapo":  # BAPO counts the step, at its starting bounds
        assert loss_fn.state_dict()["surrogate (bapo)"] == {"clip_low": 0.6, "clip_high": 1.2, "steps": 1}


@pytest.mark.parametrize("advantages", [True, False])
@pytest.mark.parametrize("name", PRESETS)
def test_an_empty_micro_batch_works_on_every_path(name, advantages):
    loss_fn = rlstab.load(name).compile()
    batch = with_trainer_fields(loss_fn.objective, empty_batch(advantages=advantages))
    for out in (loss_fn(batch), loss_fn(batch, step=loss_fn.gather([batch]))):
        assert out.loss.item() == 0.0
        out.loss.backward()
        assert batch.logprobs.grad is not None and batch.logprobs.grad.shape == (0, 4)
        assert out.metrics["tokens/valid"] == 0


def test_empty_micro_batches_next_to_full_ones_change_nothing():
    batch = random_batch(B=8, T=4, seed=5, advantages="sequence")
    loss_fn = rlstab.load("stapo").compile()
    alone = loss_fn.gather([batch])
    padded = loss_fn.gather([empty_batch(), batch, empty_batch()])
    assert padded.counts == alone.counts and padded.thresholds == alone.thresholds


@pytest.fixture
def one_rank_group(tmp_path):
    """torch.distributed initialised in this process (gloo, world size 1), torn down afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["stare", "bapo", "stapo"])
def test_gather_of_no_micro_batch_is_refused_under_torch_distributed(name, one_rank_group):
    loss_fn = rlstab.load(name).compile()
    before = loss_fn.state_dict()
    with pytest.raises(BatchError, match=r"Pass one empty micro-batch instead \(TokenBatch with B = 0 tensors\)"):
        loss_fn.gather([])
    assert loss_fn.state_dict() == before
    stats = loss_fn.gather([empty_batch()])  # what the message asks for: it takes part in every collective
    assert stats.counts.tokens_valid == 0 and stats.counts.world_size == 1
    assert loss_fn.gather([], distributed=False).counts.tokens_valid == 0  # communication off: an empty step
