"""The compiled loss on a GPU's terms: a frozen-step call reads nothing on the host, a whole-step call only
what its step's statistics need; counted on CPU tensors with rlstab.testing.syncs.

On a GPU the deferring path is the default (``defer_checks=None`` and CUDA tensors); here it is switched
on by hand, and the quantile's device path too (``Population.ON_DEVICE``), so that what runs is what
runs on a GPU.
"""

import pytest
import torch

import rlstab
from rlstab.quantile import Population
from rlstab.testing import make_batch
from rlstab.testing.syncs import host_syncs

PRESETS = rlstab.preset_names()

# Methods whose per-micro-batch selection has a data-dependent size: max(floor(f N), 1) tokens of the
# micro-batch's N valid tokens (Clip-Cov draws them with the authors' randperm, KL-Cov takes a top-k).
SIZED_BY_THE_MICRO_BATCH = {"clip_cov": "clipping/clip_cov.py", "kl_cov": "clipping/kl_cov.py"}


@pytest.fixture
def on_device(monkeypatch):
    monkeypatch.setattr(Population, "ON_DEVICE", True)


def compiled(name: str):
    loss_fn = rlstab.load(name).compile()
    loss_fn.defer_checks = True
    return loss_fn


def sites(syncs: list[str]) -> set[str]:
    """``'clipping/clip_cov.py'`` for ``'host read: ... at /x/rlstab/clipping/clip_cov.py:96 (detached)'``."""
    return {s.split(" at ", 1)[1].split("rlstab/", 1)[-1].rsplit(":", 1)[0] for s in syncs}


@pytest.mark.parametrize("advantages", ["auto", "sequence"])
@pytest.mark.parametrize("name", PRESETS)
def test_frozen_step_call_reads_nothing_on_the_host(name, advantages, on_device):
    loss_fn = compiled(name)
    batch = make_batch(loss_fn, seed=3, advantages=advantages)
    stats = loss_fn.gather([batch])
    with host_syncs() as syncs:
        out = loss_fn(batch, step=stats)
        out.loss.backward()
    if name in SIZED_BY_THE_MICRO_BATCH:
        assert syncs and sites(syncs) == {SIZED_BY_THE_MICRO_BATCH[name]}, syncs
    else:
        assert syncs == []
    assert torch.isfinite(torch.tensor(out.metrics["loss"]))  # the read happens here, after the backward


@pytest.mark.parametrize("name", PRESETS)
def test_deferred_call_equals_the_checked_call(name):
    """Loss, gradient and metrics of the deferring path are the checked path's, bit for bit."""
    results = []
    for defer in (False, True):
        loss_fn = rlstab.load(name).compile()
        loss_fn.defer_checks = defer
        batch = make_batch(loss_fn, seed=5)
        if name == "clip_cov":  # its random draw: the same generator state for both paths
            torch.manual_seed(0)
        stats = loss_fn.gather([batch])
        out = loss_fn(batch, step=stats)
        out.loss.backward()
        results.append((out.loss.detach(), batch.logprobs.grad, dict(out.metrics)))
    (loss_a, grad_a, metrics_a), (loss_b, grad_b, metrics_b) = results
    assert torch.equal(loss_a, loss_b)
    assert torch.equal(grad_a, grad_b)
    assert metrics_a == metrics_b


# Whole-step calls read what their own step needs, each at a place named in docs/gpu.md.
WHOLE_STEP_READS = {
    "compiler/step_phase.py",  # the step's denominators and the input check, one transfer
    "quantile.py",  # a quantile's size (its rank)
    "advantages/base.py",  # the number of prompt groups of an estimated advantage
}


@pytest.mark.parametrize("name", ["stapo", "20-entropy", "grpo", "dapo", "gspo", "stare", "tis", "icepop", "recipe-2026"])
def test_whole_step_call_reads_only_its_statistics(name, on_device):
    loss_fn = compiled(name)
    batch = make_batch(loss_fn, seed=3)
    with host_syncs() as syncs:
        out = loss_fn(batch)
    allowed = WHOLE_STEP_READS | ({"reweighters/stare.py"} if name == "stare" else set())  # its controller's host state
    assert sites(syncs) <= allowed, syncs
    assert sum("compiler/step_phase.py" in s for s in syncs) == 1
    dict(out.metrics)


def test_whole_step_stapo_reads_twice(on_device):
    # The counts' transfer and the entropy quantile's size, with the advantages a trainer gives.
    loss_fn = compiled("stapo")
    batch = make_batch(loss_fn, seed=3, B=64, T=256, advantages="sequence")
    with host_syncs() as syncs:
        loss_fn(batch)
    assert len(syncs) == 2, syncs
