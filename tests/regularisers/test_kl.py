"""rlstab.regularisers.kl: the per-token KL estimators k1, k2, k3 (veRL's low_var_kl, with its clamps)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlstab.regularisers.kl import KLPenalty

REF = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0]])
DELTA = torch.tensor([[0.0, 0.5, -30.0, 30.0, -math.inf]])  # log p - log p_ref


def term(estimator: str) -> list[float]:
    batch = SimpleNamespace(logprobs=(REF + DELTA).to(torch.float64))
    t = SimpleNamespace(ref_logprobs=REF, valid_bool=torch.ones_like(REF, dtype=torch.bool))
    return KLPenalty(estimator=estimator).term(batch, t)[0].tolist()


def test_k1_is_delta_and_may_be_negative():
    assert term("k1") == [0.0, 0.5, -30.0, 30.0, -math.inf]


def test_k2_is_half_delta_squared():
    # 0.5 * (0, 0.25, 900, 900)
    assert term("k2") == [0.0, 0.125, 450.0, 450.0, math.inf]


def test_k3_with_its_clamps():
    k = term("k3")
    # delta 0: e^0 - 0 - 1 = 0; delta 0.5: e^-0.5 + 0.5 - 1 = 0.10653
    assert k[0] == 0.0 and k[1] == pytest.approx(math.exp(-0.5) - 0.5, rel=1e-6)
    # delta -30: -delta clamped to 20, e^20 - 20 - 1 = 4.85e8, clamped to 10
    # delta +30: -delta clamped to -20, e^-20 + 20 - 1 = 19.0, clamped to 10
    # delta -inf: -delta clamped to 20 first (unclamped, e^inf - inf = NaN), so 10 as well
    assert k[2:] == [10.0, 10.0, 10.0]


def test_defaults_bounds_and_reads():
    kl = KLPenalty()
    assert (kl.coef, kl.estimator, kl.reads) == (0.001, "k3", frozenset({"ref_logprobs"}))
    assert KLPenalty(coef=0.5, estimator="k2").describe() == "kl: + 0.5 * Agg(k2(logp - ref_logp))"
    with pytest.raises(ValueError):
        KLPenalty(coef=10.5)
    with pytest.raises(ValueError):
        KLPenalty(estimator="k4")
