"""The correlation of the logit-gradient norm with the entropy at fixed probability, on a hand-made token set."""

from __future__ import annotations

import pytest
import torch

from rlstab.trainer.mechanism.logit_grad import entropy_at_fixed_probability


def test_within_bin_spearman_weighted_by_the_bins_token_counts():
    # bin [0.01, 0.1): 10 tokens, direction rises with H (rho +1), norm = H^2 rises too (rho +1);
    # bin [0.5, 0.9): 12 tokens, direction falls with H (rho -1), norm constant (rho undefined);
    # bin [0.9, 0.99): 3 tokens, fewer than 10: left out whatever they hold.
    h1, h2, h3 = torch.arange(1.0, 11.0), torch.arange(1.0, 13.0), torch.tensor([1.0, 2.0, 3.0])
    p = torch.cat([torch.full((10,), 0.05), torch.full((12,), 0.6), torch.full((3,), 0.95)])
    h = torch.cat([h1, h2, h3])
    direction = torch.cat([h1, -h2, h3])
    norm = torch.cat([h1 ** 2, torch.full((12,), 2.0), -h3])
    out = entropy_at_fixed_probability(p, h, {"direction": direction, "norm": norm})
    assert [(b["low"], b["high"], b["count"]) for b in out["bins"]] == [(0.01, 0.1, 10), (0.5, 0.9, 12)]
    assert out["bins"][0]["direction"] == pytest.approx(1.0) and out["bins"][1]["direction"] == pytest.approx(-1.0)
    assert out["bins"][1]["norm"] is None
    assert out["tokens"] == 22
    assert out["direction"] == pytest.approx((10 * 1.0 + 12 * -1.0) / 22)  # -2/22 = -0.0909
    assert out["norm"] == pytest.approx(1.0)  # bin 1 only: 10 * 1 / 10


def test_no_bin_with_enough_tokens_gives_none():
    p, h = torch.full((9,), 0.05), torch.arange(9.0)
    out = entropy_at_fixed_probability(p, h, {"direction": h})
    assert out == {"bins": [], "tokens": 0, "direction": None}
