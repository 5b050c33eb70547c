"""VCPO's ESS learning-rate scale, hand-computed."""

import math

import pytest
import torch

import rlstab
from rlstab.step import effective_sample_size, ess_lr_scale


def test_ess_of_equal_and_unequal_weights():
    assert effective_sample_size(torch.zeros(3)) == pytest.approx(3.0)
    # w = 1, 3: (1 + 3)^2 / (1 + 9) = 1.6
    assert effective_sample_size(torch.log(torch.tensor([1.0, 3.0]))) == pytest.approx(1.6)
    # huge log-weights do not overflow: w = e^1000 twice is ESS 2
    assert effective_sample_size(torch.tensor([1000.0, 1000.0])) == pytest.approx(2.0)


def test_scale_rules():
    lw = torch.log(torch.tensor([1.0, 3.0]))  # ESS 1.6 of B = 2: fraction 0.8
    assert ess_lr_scale(lw) == pytest.approx((math.sqrt(0.8), 1.6))
    assert ess_lr_scale(lw, rule="linear")[0] == pytest.approx(0.8)
    assert ess_lr_scale(lw, base_ratio=0.5)[0] == 1.0  # min(1, 0.8 / 0.5)
    assert ess_lr_scale(torch.zeros(0)) == (1.0, 0.0)


def batch(mask=None):
    # Row 0: trainer and sampler agree (log w = 0); row 1: log w = log 1.5 + log 2 = log 3 over its two tokens.
    old = torch.log(torch.tensor([[0.5, 0.5], [0.3, 0.4]]))
    rollout = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.2]]))
    mask = torch.ones(2, 2, dtype=torch.bool) if mask is None else mask
    return rlstab.TokenBatch(logprobs=old.clone(), old_logprobs=old, rollout_logprobs=rollout,
                             response_mask=mask, advantages=torch.ones(2))


def objective(**ess):
    return rlstab.load({"extends": "grpo", "lr_scale": {"kind": "ess", **ess}}).compile()


def test_gather_returns_the_scale_for_the_trainer():
    loss_fn = objective()
    stats = loss_fn.gather([batch()])
    # w = 1, 3: ESS 1.6, B = 2: sqrt(0.8)
    assert stats.lr_scale == pytest.approx(math.sqrt(0.8))
    out = loss_fn(batch(), step=stats)
    assert out.metrics["step/lr_scale"] == pytest.approx(math.sqrt(0.8))
    assert (out.metrics["step/ess"], out.metrics["step/ess_fraction"]) == pytest.approx((1.6, 0.8))
    assert rlstab.load("grpo").compile().gather([batch()]).lr_scale == 1.0  # no lr_scale: 1


def test_the_step_spans_micro_batches():
    b = batch()
    parts = [rlstab.TokenBatch(**{f: (getattr(b, f)[i : i + 1] if isinstance(getattr(b, f), torch.Tensor) else None)
                                  for f in b.__dataclass_fields__}) for i in (0, 1)]
    assert objective().gather(parts).lr_scale == pytest.approx(math.sqrt(0.8))


def test_clipped_weights():
    # cap 2: w = 1, 2: ESS = 9 / 5 = 1.8, fraction 0.9
    assert objective(clip=2.0).gather([batch()]).lr_scale == pytest.approx(math.sqrt(0.9))


def test_padding_and_empty_responses():
    # Row 1's second token is padding: log w = log 1.5; row 0 is empty and leaves B: one response, ESS 1, scale 1.
    mask = torch.tensor([[False, False], [True, False]])
    stats = objective().gather([batch(mask)])
    assert stats.step_level.responses == 1 and stats.lr_scale == 1.0
    mask = torch.tensor([[True, True], [True, False]])  # w = 1, 1.5: ESS 6.25 / 3.25, B = 2
    assert objective(rule="linear").gather([batch(mask)]).lr_scale == pytest.approx(6.25 / 3.25 / 2)


def test_numerator_current():
    # current logprobs: row 1 = log 0.2 (equal to the sampler's): every w = 1: scale 1; the default uses old.
    b = batch()
    cur = b.old_logprobs.clone()
    cur[1] = b.rollout_logprobs[1]
    b = rlstab.TokenBatch(**{**{f: getattr(b, f) for f in b.__dataclass_fields__}, "logprobs": cur})
    assert objective(numerator="current").gather([b]).lr_scale == pytest.approx(1.0)
    assert objective().gather([b]).lr_scale == pytest.approx(math.sqrt(0.8))


def test_ess_needs_rollout_logprobs_and_valid_fields():
    b = rlstab.TokenBatch(logprobs=torch.zeros(1, 2), response_mask=torch.ones(1, 2, dtype=torch.bool),
                          advantages=torch.ones(1))
    with pytest.raises(rlstab.BatchError, match=r"lr_scale \(ess\) reads TokenBatch\.rollout_logprobs"):
        objective().gather([b])
    with pytest.raises(rlstab.ConfigError, match=r"lr_scale\.rule = 'cubic'"):
        objective(rule="cubic")
    with pytest.raises(rlstab.ConfigError, match=r"lr_scale\.base_ratio = 0\.0"):
        objective(base_ratio=0.0)
