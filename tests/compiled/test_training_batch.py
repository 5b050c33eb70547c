"""``begin_training_batch``: STARE's gate and controller move once per training batch, from the whole batch."""

import pytest
import torch

import rlstab

from batches import random_batch

# H_tgt = 1.0 inside random_batch's entropies (uniform on [0, 2]); scaled below so the mean is known.
STARE = {"extends": "dapo", "reweighters": [{"kind": "stare", "adaptive": True, "alpha": 0.05, "target_entropy": 1.0}]}


def batch_with_entropy(seed: int, level: float) -> rlstab.TokenBatch:
    """A batch whose valid tokens all have entropy ``level`` (padding holds NaN, which nothing may read)."""
    b = random_batch(B=6, T=5, seed=seed, advantages="sequence")
    entropy = torch.where(b.response_mask.bool(), torch.full_like(b.entropy, level), float("nan"))
    fields = {f: getattr(b, f) for f in b.__dataclass_fields__}
    return rlstab.TokenBatch(**{**fields, "entropy": entropy, "logprobs": b.logprobs.detach()})


def controller(compiled) -> dict:
    return compiled.state_dict()["reweighters[0] (stare)"]


def test_the_controller_moves_once_per_training_batch_from_its_mean_entropy():
    compiled = rlstab.load(STARE).compile()
    low, high = batch_with_entropy(0, 0.5), batch_with_entropy(1, 1.8)
    n_low, n_high = low.response_mask.sum().item(), high.response_mask.sum().item()
    # (entropies are float32: 1.8 is 1.79999995) H_bar over both mini-batches: (0.5 n_low + 1.8 n_high) / (n_low + n_high), not either one's.
    expected = (0.5 * n_low + 1.8 * n_high) / (n_low + n_high)
    compiled.begin_training_batch([low, high])
    state = controller(compiled)
    assert state["H_bar"] == pytest.approx(expected, rel=1e-6)
    # one move: H_bar > H_tgt = 1.0 when n_high dominates, < 1.0 otherwise; W = 1.1 -/+ 0.05, once
    sign = 1 if expected < 1.0 else -1
    assert state["W"] == pytest.approx(1.1 + 0.05 * sign)
    # Two optimizer steps of the batch, each with its own entropy level: neither moves the controller again,
    # and both train with the batch's gate and W.
    for mb in (low, high):
        stats = compiled.gather([mb])
        out = compiled(mb, step=stats)
        assert controller(compiled) == state
        assert out.metrics["reweight/stare/W"] == pytest.approx(state["W"])  # metrics are float32
        assert out.metrics["reweight/stare/H_bar"] == pytest.approx(expected, rel=1e-6)
    # The next training batch moves it once more.
    compiled.begin_training_batch([low])
    assert controller(compiled)["H_bar"] == pytest.approx(0.5)
    assert controller(compiled)["W"] == pytest.approx(state["W"] + 0.05)


def test_optimizer_step_cadence_moves_on_every_gather():
    compiled = rlstab.load({**STARE, "reweighters": [{**STARE["reweighters"][0], "cadence": "optimizer_step"}]}).compile()
    low = batch_with_entropy(0, 0.5)
    compiled.begin_training_batch([low])  # nothing has a training-batch cadence: nothing moves
    assert controller(compiled)["H_bar"] is None
    for k in (1, 2):
        compiled.gather([low])
        assert controller(compiled)["W"] == pytest.approx(1.1 + 0.05 * k)


def test_without_begin_training_batch_each_gather_is_its_own_batch():
    compiled = rlstab.load(STARE).compile()
    low = batch_with_entropy(0, 0.5)
    for k in (1, 2):
        compiled.gather([low])
        assert controller(compiled)["W"] == pytest.approx(1.1 + 0.05 * k)


def test_load_state_dict_ends_the_current_training_batch():
    compiled = rlstab.load(STARE).compile()
    compiled.begin_training_batch([batch_with_entropy(0, 0.5)])
    saved = compiled.state_dict()
    fresh = rlstab.load(STARE).compile()
    fresh.begin_training_batch([batch_with_entropy(1, 1.8)])
    fresh.load_state_dict(saved)
    fresh.gather([batch_with_entropy(2, 1.8)])  # its own batch again: moves from the restored state
    assert controller(fresh)["W"] == pytest.approx(saved["reweighters[0] (stare)"]["W"] - 0.05)


def test_a_failed_begin_training_batch_leaves_the_state_as_it_was():
    compiled = rlstab.load(STARE).compile()
    before = compiled.state_dict()
    bad = batch_with_entropy(0, 0.5)
    with pytest.raises(rlstab.BatchError):
        compiled.begin_training_batch([bad, "not a batch"])
    assert compiled.state_dict() == before
