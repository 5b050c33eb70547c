"""Low-probability advantage reweighting (AR), hand-computed."""

import math

import pytest
import torch

import rlstab

MASK = torch.tensor([[True, True, False]])
OBJECTIVE = {
    "reweighters": [{"kind": "low_probability_reweight"}],
    "surrogate": {"kind": "none"},
    "aggregation": {"kind": "token-mean", "count": "valid"},
}


def test_factor_is_alpha_p_old_plus_one_minus_alpha():
    # p_old = 0.5, 0.1 (on-policy, r = 1), A = 1. Factors 0.3 * 0.5 + 0.7 = 0.85 and 0.3 * 0.1 + 0.7 = 0.73.
    # token-mean over 2 valid tokens of -A w: -(0.85 + 0.73) / 2 = -0.79; d/dlogp = -w / 2.
    logprobs = torch.log(torch.tensor([[0.5, 0.1, 0.9]])).requires_grad_()
    out = rlstab.load(OBJECTIVE).compile()(rlstab.TokenBatch(logprobs=logprobs, advantages=torch.ones(1), response_mask=MASK))
    assert out.loss.item() == pytest.approx(-0.79)
    out.loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-0.425, -0.365, 0.0])
    assert out.metrics["reweight/low_probability_reweight/mean"] == pytest.approx(0.79)


def test_old_probability_fixes_the_factor_across_updates():
    # The factor follows p_old = 0.5 (0.85), not the current p = 0.1 (0.73): loss = -A r w with r = 0.2.
    old = torch.full((1, 3), math.log(0.5))
    logprobs = torch.full((1, 3), math.log(0.1)).requires_grad_()
    batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=torch.ones(1), response_mask=MASK)
    out = rlstab.load(OBJECTIVE).compile()(batch)
    assert out.loss.item() == pytest.approx(-0.2 * 0.85)


def test_alpha_out_of_range_is_refused():
    with pytest.raises(rlstab.ConfigError, match=r"reweighters\[0\]\.alpha = 1\.5"):
        rlstab.load({**OBJECTIVE, "reweighters": [{"kind": "low_probability_reweight", "alpha": 1.5}]})
