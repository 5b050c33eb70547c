"""KL-Cov: hand-computed top-k selection and penalty, and the gradient against autograd."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

LOGP = [-1.0, -2.0, -0.5, -3.0]
LOG_R = [0.2, -0.3, 0.1, 0.4]
ADV = [1.0, -1.0, 2.0, 0.0]
# mean A = 0.5, mean log p = -1.625
# cov = (A - 0.5)(log p + 1.625): 0.5*0.625 = 0.3125, -1.5*-0.375 = 0.5625, 1.5*1.125 = 1.6875, -0.5*-1.375 = 0.6875
# ranking: token 3 (1.6875), token 4 (0.6875), token 2 (0.5625), token 1 (0.3125)


def rows(fraction):
    old = [lp - lr for lp, lr in zip(LOGP, LOG_R)]
    return one_row(None, ADV, {"kind": "kl_cov", "fraction": fraction, "coef": 1.0}, logprobs=LOGP, old=old)


def test_hand_computed_top_one():
    out, grad = rows(0.25)  # k = max(floor(0.25 * 4), 1) = 1: token 3
    # l = -A r (+ |log r| on token 3): -e^0.2 = -1.2214028; e^-0.3 = 0.7408182; -2 e^0.1 + 0.1 = -2.1103418; 0
    # token-mean: -2.5909264 / 4 = -0.6477316
    assert out.loss.item() == pytest.approx(-0.6477316, abs=1e-6)
    # dl/dlogp = -A r + sign(log r) on token 3: -1.2214028, 0.7408182, -2.2103418 + 1, 0
    assert torch.allclose(grad, torch.tensor([-1.2214028, 0.7408182, -1.2103418, 0.0]) / 4, atol=1e-6)
    assert out.metrics["kl_cov/penalised_fraction"] == 0.25


def test_hand_computed_top_two():
    out, grad = rows(0.5)  # k = 2: tokens 3 and 4; token 4 (A = 0) pays |0.4| = 0.4 with gradient +1
    assert out.loss.item() == pytest.approx((-2.5909264 + 0.4) / 4, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([-1.2214028, 0.7408182, -1.2103418, 1.0]) / 4, atol=1e-6)


def test_at_least_one_token_is_penalised():
    out, _ = rows(1e-6)  # floor(4e-6) = 0 -> max(0, 1) = 1
    assert out.metrics["kl_cov/penalised_fraction"] == 0.25


def test_no_clip():
    # r = e^2 with A > 0 would be clipped by PPO; KL-Cov trains it: dl/dlogp = -A r (one token: it is the top-1,
    # so it also pays |log r|: gradient -e^2 + 1)
    out, grad = one_row([2.0], [1.0], {"kind": "kl_cov"}, old=-3.0)  # log-prob -1: at most 0
    assert grad.item() == pytest.approx(-math.exp(2.0) + 1.0, rel=1e-6)


@pytest.mark.parametrize("fraction", [0.002, 0.05, 0.3])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, fraction):
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad({"kind": "kl_cov", "fraction": fraction, "coef": 0.7}, batch)
    # the top-k, recomputed independently: covariance over valid tokens, k = max(floor(f N), 1)
    valid = batch.response_mask
    A, lp = batch.advantages[valid], batch.logprobs.detach()[valid]
    cov = (A - A.mean()) * (lp - lp.mean())
    k = max(1, int(len(cov) * fraction))
    selected = torch.zeros(len(cov))
    selected[torch.argsort(cov, descending=True)[:k]] = 1.0
    s = torch.zeros_like(batch.advantages)
    s[valid] = selected

    def per_token(x):
        return -batch.advantages * ratio(x, batch) + 0.7 * s * (x - batch.old_logprobs).abs()

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.metrics["kl_cov/penalised_fraction"] == pytest.approx(k / int(valid.sum()))
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)


def test_selection_is_per_micro_batch():
    """Documented scope: each micro-batch selects its own top-k, so a split selects more tokens."""
    batch = off_policy_batch(0)
    fn = rlstab.load("kl_cov").compile()
    whole = fn(batch).metrics["kl_cov/penalised_fraction"] * int(batch.response_mask.sum())
    assert whole == pytest.approx(1.0)  # floor(0.002 * N) = 0 for this batch's N -> 1 token
    halves = [rlstab.TokenBatch(**{f: getattr(batch, f)[sl] for f in ("logprobs", "old_logprobs", "advantages",
                                                                       "response_mask", "entropy")})
              for sl in (slice(0, 6), slice(6, 12))]
    stats = fn.gather(halves)
    counts = [fn(h, step=stats).metrics["kl_cov/penalised_fraction"] * int(h.response_mask.sum()) for h in halves]
    assert counts == pytest.approx([1.0, 1.0])


def test_preset():
    s = rlstab.load("kl_cov").surrogate
    assert (s.fraction, s.coef) == (0.002, 1.0)
