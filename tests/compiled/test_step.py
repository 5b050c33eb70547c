"""The two-phase step API: a step split into micro-batches (and ranks) equals the whole step at once."""

import pytest
import torch

import rlstab
from rlstab.explain import explain
from rlstab.testing.spawned_ranks import run_ranks

import step_worker
from batches import random_batch, with_trainer_fields
from step_worker import run_step, take

SPLITS = [(0, 3), (3, 8), (8, 12), (12, 16)]  # 4 uneven micro-batches of a 16-response step


def whole_and_split(name, batch):
    loss_fn = rlstab.load(name).compile()
    whole_leaf = batch.logprobs.detach().clone().requires_grad_()
    whole = loss_fn(take(batch, 0, len(whole_leaf), whole_leaf))
    whole.loss.backward()

    split_leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = [take(batch, lo, hi, split_leaf) for lo, hi in SPLITS]
    stats, total = run_step(loss_fn, micro)
    return whole, whole_leaf.grad, total, split_leaf.grad, stats


# Presets with a component that selects tokens within each micro-batch (as its paper's code does):
# their loss depends on the split by design, and `rlstab explain` says so.
PER_MICRO_BATCH = [n for n in rlstab.preset_names() if rlstab.load(n).compile().per_micro_batch()]
STEP_WIDE = [n for n in rlstab.preset_names() if n not in PER_MICRO_BATCH]


def test_per_micro_batch_presets_are_the_documented_ones():
    assert set(PER_MICRO_BATCH) >= {"clip_cov", "kl_cov", "stare"}
    for name in PER_MICRO_BATCH:
        assert "Computed within each micro-batch instead" in explain(rlstab.load(name)), name


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_per_micro_batch_selection_depends_on_the_split(name):
    batch = random_batch(B=16, T=24, seed=11, advantages="token")
    whole, _, total, _, _ = whole_and_split(name, batch)
    assert total != pytest.approx(whole.loss.item(), abs=1e-6)


@pytest.mark.parametrize("advantages", [None, "sequence", "token"])
@pytest.mark.parametrize("name", STEP_WIDE)
def test_four_micro_batches_equal_the_whole_step(name, advantages):
    batch = with_trainer_fields(rlstab.load(name), random_batch(B=16, T=24, seed=11, advantages=advantages))
    whole, whole_grad, total, split_grad, stats = whole_and_split(name, batch)
    assert total == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(split_grad, whole_grad, atol=1e-6, rtol=0)
    thresholds = [k for k in whole.metrics if k.endswith("_threshold")]
    assert [t.item() for t in stats.thresholds if t is not None] == [whole.metrics[k] for k in thresholds]


def test_the_split_matters_without_a_step():
    # Without step statistics each micro-batch is its own scope: thresholds and denominators differ.
    batch = random_batch(B=16, T=24, seed=11)
    loss_fn = rlstab.load("stapo").compile()
    whole = loss_fn(batch).loss.item()
    leaf = batch.logprobs.detach().clone().requires_grad_()
    separate = sum(loss_fn(take(batch, lo, hi, leaf)).loss.item() for lo, hi in SPLITS)
    assert separate != pytest.approx(whole, abs=1e-6)


def test_bf16_inputs_compute_in_float32():
    batch = random_batch(seed=5, dtype=torch.bfloat16)
    out = rlstab.load("stapo").compile()(batch)
    assert out.loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    assert grad.dtype == torch.bfloat16 and torch.isfinite(grad.float()).all()


# ---------------------------------------------------------------- two gloo ranks

@pytest.mark.parametrize("name", ["stapo", "20-entropy", "dr_grpo"])
def test_two_ranks_equal_one_process(name):
    results = run_ranks(step_worker.run_rank, name, world=2)

    batch = random_batch(B=16, T=24, seed=11)
    loss_fn = rlstab.load(name).compile()
    whole = loss_fn(batch)
    (whole_grad,) = torch.autograd.grad(whole.loss, batch.logprobs)
    whole_stats = loss_fn.gather([batch])
    for rank in (0, 1):
        grad, thresholds, counts = results[rank]
        assert torch.allclose(grad, whole_grad, atol=1e-6, rtol=0)
        assert thresholds == [None if t is None else t.item() for t in whole_stats.thresholds]
        assert (counts.tokens_valid, counts.tokens_kept) == (whole_stats.counts.tokens_valid, whole_stats.counts.tokens_kept)
        assert counts.world_size == 2


def test_histogram_quantile_mode_stays_within_its_bound_of_the_exact_threshold():
    # 96 x 200 tokens, ~9,600 valid: over the 8,192 that are sorted, so both modes take the radix path.
    batch = random_batch(B=96, T=200, seed=7)
    exact = rlstab.load("20-entropy").compile().gather([batch])
    approx = rlstab.load({"extends": "20-entropy", "quantile_mode": "histogram"}).compile().gather([batch])
    assert exact.counts.tokens_valid > 8192
    (e,), (a,) = exact.thresholds, approx.thresholds
    # rlstab.quantile: |error| < max(|x| / 128, 2**-133), x the larger of the two interpolated order statistics;
    # their gap is far below |x| here, so |x| / 128 of the threshold with 1% slack bounds it.
    assert abs(a.item() - e.item()) <= 1.01 * abs(e.item()) / 128
    assert a.item() != e.item()  # the histogram mode did run
    assert approx.counts.tokens_valid == exact.counts.tokens_valid


def test_quantile_mode_is_validated_with_its_path():
    with pytest.raises(rlstab.ConfigError, match="quantile_mode"):
        rlstab.load({"extends": "20-entropy", "quantile_mode": "approximate"})
