"""Clip-Cov: hand-computed candidates and detaching, controlled randomness, gradient against autograd."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab
from rlstab.tokens import Tokens

LOGP = [-0.5, -0.5, -3.0, -1.0, -1.5]
LOG_R = [0.1, 0.5, -0.1, 0.0, -0.5]
ADV = [2.0, 2.0, -2.0, 0.0, -2.0]
# mean A = 0, mean log p = -1.3;  cov = A (log p + 1.3) = [1.6, 1.6, 3.4, 0, 0.4]
# band 1 < cov < 5: tokens 1, 2, 3; token 2 (A > 0, r = e^0.5 = 1.6487 > 1.2) is clipped by the ratio clip
# and excluded, so the candidates are tokens 1 and 3 (in row-major order).
# PPO clip 0.2 (l, dl/dlogp):  1: -2 e^0.1 = -2.2103418 (-2.2103418)   2: -2 * 1.2 = -2.4 (0)
#                              3: 2 e^-0.1 = 1.8096748 (1.8096748)     4: 0 (0)   5: 2 * 0.8 = 1.6 (0, clipped low)


def rows(**fields):
    surrogate = {"kind": "clip_cov", "eps_low": 0.2, "eps_high": 0.2, **fields}
    old = [lp - lr for lp, lr in zip(LOGP, LOG_R)]
    return one_row(None, ADV, surrogate, logprobs=LOGP, old=old)


def test_every_candidate_detached_when_the_fraction_allows():
    out, grad = rows(fraction=1.0, seed=0)  # k = max(floor(1.0 * 5), 1) = 5 >= 2 candidates: both detached
    # loss: tokens 2 and 5 only (clipped, constant): (-2.4 + 1.6) / 5 = -0.16; no gradient anywhere
    assert out.loss.item() == pytest.approx(-0.16, abs=1e-6)
    assert torch.equal(grad, torch.zeros(5))
    assert out.metrics["clip/cov_fraction"] == pytest.approx(2 / 5)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 5)  # token 2
    assert out.metrics["clip/low_fraction"] == pytest.approx(1 / 5)  # token 5


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_one_candidate_drawn_by_the_seeded_permutation(seed):
    out, grad = rows(fraction=0.2, seed=seed)  # k = max(floor(0.2 * 5), 1) = 1 of the 2 candidates
    # the draw: the first entry of randperm(2) from a generator seeded with `seed` -> candidate 0 (token 1) or 1 (token 3)
    first = int(torch.randperm(2, generator=torch.Generator().manual_seed(seed))[0])
    ppo = torch.tensor([-2.2103418, 0.0, 1.8096748, 0.0, 0.0]) / 5
    detached_token = [0, 2][first]
    expected = ppo.clone()
    expected[detached_token] = 0.0
    assert torch.allclose(grad, expected, atol=1e-6)
    values = [-2.2103418, -2.4, 1.8096748, 0.0, 1.6]
    values[detached_token] = 0.0
    assert out.loss.item() == pytest.approx(sum(values) / 5, abs=1e-6)
    assert out.metrics["clip/cov_fraction"] == pytest.approx(1 / 5)


def test_global_generator_is_veRLs_procedure():
    # seed: null draws torch.randperm(n) from the global CPU generator: torch.manual_seed(s) reproduces seed: s
    for s in range(6):
        torch.manual_seed(s)
        _, global_grad = rows(fraction=0.2)
        _, seeded_grad = rows(fraction=0.2, seed=s)
        assert torch.equal(global_grad, seeded_grad)


def test_seeded_draw_ignores_the_global_generator():
    torch.manual_seed(1)
    _, a = rows(fraction=0.2, seed=3)
    torch.manual_seed(2)
    _, b = rows(fraction=0.2, seed=3)
    assert torch.equal(a, b)


@pytest.mark.parametrize("fraction", [2e-4, 0.02, 0.5])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, fraction):
    batch = off_policy_batch(seed)
    surrogate = {"kind": "clip_cov", "eps_low": 0.2, "eps_high": 0.28, "fraction": fraction, "seed": seed}
    out, grad = rlstab_loss_and_grad(surrogate, batch)
    component = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": "token-mean", "count": "valid"}}).surrogate
    tokens = Tokens.from_batch(batch, 20.0)
    tokens.set_advantages(batch.advantages)
    drawn = component.detached(tokens).bool()  # the same seed, so the same draw as the loss made
    cand = _candidates(batch)
    n_valid, n_cand = int(batch.response_mask.sum()), int(cand.sum())
    assert n_cand > 0
    assert not (drawn & ~cand).any()  # only candidates are drawn
    assert int(drawn.sum()) == min(max(int(fraction * n_valid), 1), n_cand)

    def per_token(lp):  # PPO clip (textbook max form), zeroed on the drawn tokens
        r = ratio(lp, batch)
        A = batch.advantages
        return torch.maximum(-A * r, -A * r.clamp(0.8, 1.28)) * (~drawn)

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert out.metrics["clip/cov_fraction"] == pytest.approx(int(drawn.sum()) / n_valid)


def _candidates(batch):
    """Independent recomputation of the candidate tokens (bool [B, T]) for eps 0.2 / 0.28."""
    valid = batch.response_mask
    A, lp = batch.advantages, batch.logprobs.detach()
    r = torch.exp((lp - batch.old_logprobs).clamp(-20, 20))
    clipped = (-A * r.clamp(0.8, 1.28)) > (-A * r)
    n = valid.sum()
    cov = (A - (A * valid).sum() / n) * (lp - (lp * valid).sum() / n)
    return valid & ~clipped & (cov > 1.0) & (cov < 5.0)


def test_padding_does_not_change_the_draw():
    batch = off_policy_batch(3)
    surrogate = {"kind": "clip_cov", "fraction": 0.05, "seed": 11}
    out, grad = rlstab_loss_and_grad(surrogate, batch)
    B, T = batch.response_mask.shape
    pad = {f: torch.cat([getattr(batch, f).detach(), torch.full((B, 5), -7.0)], dim=1)
           for f in ("logprobs", "old_logprobs", "advantages", "entropy")}
    padded = rlstab.TokenBatch(response_mask=torch.cat([batch.response_mask, torch.zeros(B, 5, dtype=torch.bool)], 1),
                               **{**pad, "logprobs": pad["logprobs"].requires_grad_()})
    pout, pgrad = rlstab_loss_and_grad(surrogate, padded)
    assert pout.loss.item() == pytest.approx(out.loss.item(), abs=1e-7)
    assert torch.allclose(pgrad[:, :T], grad, atol=1e-8)


def test_band_must_not_be_empty():
    with pytest.raises(rlstab.ConfigError, match="cov_low"):
        rlstab.load({"surrogate": {"kind": "clip_cov", "cov_low": 5.0, "cov_high": 1.0},
                     "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_preset_follows_the_authors_script():
    s = rlstab.load("clip_cov").surrogate
    assert (s.eps_low, s.eps_high, s.fraction, s.cov_low, s.cov_high, s.seed) == (1.0, 1.0, 2e-4, 1.0, 5.0, 0)
    assert math.isclose(s.fraction, 0.0002)


def test_the_draw_is_per_micro_batch():
    """Documented scope: each micro-batch draws max(floor(f N_mb), 1) tokens, so a split draws more."""
    batch = off_policy_batch(0)
    surrogate = {"kind": "clip_cov", "eps_low": 0.2, "eps_high": 0.28, "fraction": 2e-4, "cov_low": 0.0, "seed": 0}
    fn = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": "token-mean", "count": "valid"}}).compile()
    n_valid = int(batch.response_mask.sum())
    assert fn(batch).metrics["clip/cov_fraction"] * n_valid == pytest.approx(1.0)  # floor(2e-4 N) = 0 -> 1 token
    fields = ("logprobs", "old_logprobs", "advantages", "response_mask", "entropy")
    halves = [rlstab.TokenBatch(**{f: getattr(batch, f)[sl] for f in fields}) for sl in (slice(0, 6), slice(6, 12))]
    stats = fn.gather(halves)
    drawn = [fn(h, step=stats).metrics["clip/cov_fraction"] * int(h.response_mask.sum()) for h in halves]
    assert drawn == pytest.approx([1.0, 1.0])
