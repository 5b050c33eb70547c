"""The entropy-quantile mask on a hand-built batch.

Valid entropies, sorted: 0.1 ... 0.9 (9 tokens); Q_0.8 = 0.74 (position 6.4, see test_s2t.py).
A = (+2, -1), on-policy, so l = -A on kept tokens.
"""

import pytest
import torch

import rlstab

H = torch.tensor([[0.1, 0.7, 0.8, 0.4, 0.5], [0.6, 0.2, 0.3, 0.9, 5.0]])
MASK = torch.tensor([[True] * 5, [True] * 4 + [False]])
A = torch.tensor([2.0, -1.0])


def run(mask, count):
    logprobs = torch.full((2, 5), -0.5, requires_grad=True)
    batch = rlstab.TokenBatch(logprobs=logprobs, advantages=A, response_mask=MASK, entropy=H)
    objective = rlstab.load({"masks": [mask], "aggregation": {"kind": "token-mean", "count": count}})
    out = objective.compile()(batch)
    out.loss.backward()
    return out, logprobs.grad


def test_top_20_percent_with_all_valid_tokens_as_denominator():
    out, grad = run({"kind": "entropy_quantile", "rho": 0.2}, "valid")
    # Keep H >= 0.74: row 0 t2 (0.8, l = -2) and row 1 t3 (0.9, l = +1); the padded 5.0 is not a token.
    assert out.metrics["mask/entropy_quantile/entropy_threshold"] == pytest.approx(0.74)
    assert out.metrics["mask/entropy_quantile/kept"] == 2
    assert out.loss.item() == pytest.approx((-2 + 1) / 9)
    expected = torch.zeros(2, 5)
    expected[0, 2], expected[1, 3] = -2 / 9, 1 / 9
    assert torch.allclose(grad, expected, atol=1e-7)


def test_bottom_is_the_complement_of_top():
    out, grad = run({"kind": "entropy_quantile", "rho": 0.8, "side": "bottom"}, "kept")
    # Keep H < Q_0.8 = 0.74: every valid token but row 0 t2 and row 1 t3; 7 kept.
    assert out.metrics["mask/entropy_quantile/kept"] == 7
    # Row 0 keeps t0 t1 t3 t4 (l = -2 each), row 1 keeps t0 t1 t2 (l = +1 each): (-8 + 3) / 7.
    assert out.loss.item() == pytest.approx(-5 / 7)
    assert grad[0, 2].item() == 0.0 and grad[1, 3].item() == 0.0


def test_rho_one_keeps_every_token():
    out, _ = run({"kind": "entropy_quantile", "rho": 1.0}, "valid")
    assert out.metrics["mask/entropy_quantile/kept"] == 9


def test_preset_20_entropy():
    o = rlstab.load("20-entropy")
    (m,) = o.masks
    assert (m.kind, m.rho, m.side) == ("entropy_quantile", 0.2, "top")
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert (o.surrogate.eps_low, o.surrogate.eps_high) == (0.2, 0.28)
