"""VESPO (the built-in ``vespo`` surrogate): hand-computed kernels, the closed-form gradient against autograd, padding.

Most tests call the component directly (``VESPO().evaluate(tokens, weight)``), as the compiled
objective calls every surrogate: ``weight`` is the per-token aggregation weight (1 / N on the valid
tokens for token-mean over N valid tokens, 0 on padding). TRL 1.16's own ``loss_type="vespo"`` is
compared in ``tests/adapters/trl/test_vespo.py`` (TRL's suite); nothing here needs TRL.
"""

from __future__ import annotations

import math
from importlib.metadata import entry_points

import pytest
import torch
from pydantic import ValidationError

import rlstab
from rlstab.clipping import VESPO, Surrogate
from rlstab.testing import check_component
from rlstab.tokens import Tokens

LOG2 = math.log(2.0)


def tokens(log_ratio, advantages, mask=None, *, logprobs=None, rollout_gap=None, clamp=20.0):
    """``Tokens`` with these log-ratios (old = logprobs - log_ratio), advantages ([B] or [B, T]) and mask.

    ``logprobs`` default to -1 everywhere; ``rollout_gap`` is old - rollout per token (rollout_logprobs)."""
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float32)
    lp = torch.full_like(log_ratio, -1.0) if logprobs is None else torch.as_tensor(logprobs, dtype=torch.float32)
    mask = torch.ones_like(log_ratio, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
    old = lp - log_ratio
    rollout = None if rollout_gap is None else old - torch.as_tensor(rollout_gap, dtype=torch.float32)
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, rollout_logprobs=rollout)
    t = Tokens.from_batch(batch, clamp)
    t.set_advantages(adv)
    return t


def token_mean(t: Tokens) -> torch.Tensor:
    """The token-mean weight: 1 / N on valid tokens, 0 on padding."""
    return t.valid / t.valid.sum().clamp(min=1.0)


def phi_of(t: Tokens, **fields) -> torch.Tensor:
    """Each row's kernel, read off the gradient of a one-token-weight evaluation: grad = -phi A weight."""
    out = VESPO(**fields).evaluate(t, t.valid)
    return out.grad / (-t.advantages).where(t.valid_bool, 1.0)


# ---------------------------------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("adv", [1.0, -1.0, 0.0])
def test_on_policy_phi_is_one(adv):
    # W = 1: phi = 1^k e^{lambda (1 - 1)} = 1 for either sign, so l = -A log p and dl/dlogp = -A
    t = tokens([[0.0, 0.0, 0.0]], [adv], logprobs=[[-1.0, -2.0, -0.5]])
    out = VESPO().evaluate(t, token_mean(t))
    # token-mean: -A (-1 - 2 - 0.5) / 3 = 3.5 A / 3
    assert out.loss.item() == pytest.approx(3.5 * adv / 3, abs=1e-7)
    assert torch.allclose(out.grad, torch.full((1, 3), -adv / 3))
    assert out.counts["vespo/phi_mean"].item() == pytest.approx(3.0)  # phi = 1 on each of the 3 valid tokens
    assert out.counts["vespo/phi_below_half_fraction"].item() == 0.0


def test_one_token_positive_advantage():
    # log W = log 2, A = 1 > 0: k = 2, lambda = 3;  phi = e^3 * 2^2 * e^{-3*2} = 4 e^{-3} = 0.199148
    t = tokens([[LOG2]], [1.0], logprobs=[[-1.5]])
    out = VESPO().evaluate(t, token_mean(t))
    phi = 4 * math.exp(-3)
    assert out.grad.item() == pytest.approx(-phi, rel=1e-6)  # -phi * A
    assert out.loss.item() == pytest.approx(-phi * 1.0 * -1.5, rel=1e-6)  # -phi A log p = 0.298722
    assert out.counts["vespo/phi_below_half_fraction"].item() == 1.0  # 0.199 < 0.5


def test_one_token_negative_advantage():
    # log W = log 2, A = -2 < 0: k = 3, lambda = 2;  phi = e^2 * 2^3 * e^{-2*2} = 8 e^{-2} = 1.082682
    t = tokens([[LOG2]], [-2.0], logprobs=[[-1.5]])
    out = VESPO().evaluate(t, token_mean(t))
    phi = 8 * math.exp(-2)
    assert out.grad.item() == pytest.approx(2.0 * phi, rel=1e-6)  # -phi * A = 2.165365
    assert out.loss.item() == pytest.approx(-phi * -2.0 * -1.5, rel=1e-6)  # -3.248047
    assert out.counts["vespo/phi_mean"].item() == pytest.approx(phi, rel=1e-6)
    assert out.counts["vespo/phi_below_half_fraction"].item() == 0.0


def test_w_is_the_product_of_the_token_ratios_not_their_geometric_mean():
    # Two tokens with r = 2 each: W = 4 (GSPO's length-normalised ratio would be 2).
    # A > 0: phi = e^3 * 4^2 * e^{-3*4} = 16 e^{-9} = 0.00197480;  with W = 2 it would be 4 e^{-3} = 0.199
    t = tokens([[LOG2, LOG2]], [1.0])
    assert torch.allclose(phi_of(t), torch.full((1, 2), 16 * math.exp(-9)), rtol=1e-5)
    # r = 2 then r = 1/2: W = 1, phi = 1
    assert torch.allclose(phi_of(tokens([[LOG2, -LOG2]], [1.0])), torch.ones(1, 2), atol=1e-6)


def test_the_parameters_enter_as_written():
    # k = 1, lambda = 0.5, W = 2: phi = 2 e^{0.5 (1 - 2)} = 2 e^{-0.5} = 1.213061
    t = tokens([[LOG2]], [1.0])
    assert phi_of(t, k_pos=1.0, lambda_pos=0.5).item() == pytest.approx(2 * math.exp(-0.5), rel=1e-6)
    # the negative pair is untouched by k_pos/lambda_pos: W = 1/2, A < 0, k = 3, lambda = 2:
    # phi = e^2 (1/2)^3 e^{-1} = e / 8 = 0.339785
    t = tokens([[-LOG2]], [-1.0])
    assert phi_of(t, k_pos=1.0, lambda_pos=0.5).item() == pytest.approx(math.e / 8, rel=1e-6)


def test_log_w_is_clamped_to_its_range():
    # Above: two tokens at +15 (each within the per-token clamp 20) sum to 30, clamped to 20:
    # phi = exp(3 + 2*20 - 3 e^20) underflows to 0: the response no longer trains.
    t = tokens([[15.0, 15.0]], [1.0])
    assert torch.equal(phi_of(t), torch.zeros(1, 2))
    # Below: -15 - 15 = -30, clamped to log 1e-8: phi = e^3 (1e-8)^2 e^{-3e-8} = e^3 * 1e-16 = 2.0085537e-15
    t = tokens([[-15.0, -15.0]], [1.0])
    assert torch.allclose(phi_of(t), torch.full((1, 2), math.exp(3) * 1e-16), rtol=1e-5, atol=0.0)


def test_per_token_log_ratios_use_the_objectives_clamp():
    # log r = 30 is clamped to 20 (log_ratio_clamp) before the sum; another token at -15: log W = 5.
    # A < 0: phi = e^2 e^{3*5} e^{-2 e^5} = e^{17 - 2 e^5} = e^{-279.8} = 0 in float32, so test with k = 0, lambda = 1e-4:
    # phi = e^{1e-4 (1 - e^5)} = e^{-0.0147413} = 0.985367
    t = tokens([[30.0, -15.0]], [-1.0])
    assert torch.allclose(phi_of(t, k_neg=0.0, lambda_neg=1e-4), torch.full((1, 2), math.exp(1e-4 * (1 - math.exp(5)))))


def test_the_advantage_sign_picks_the_pair_per_token():
    # Per-token advantages of mixed sign, W = 2: A >= 0 tokens get 4 e^{-3}, A < 0 tokens 8 e^{-2}; A = 0 takes the positive pair
    t = tokens([[LOG2, 0.0, 0.0]], [[1.0, -1.0, 0.0]])
    out = VESPO().evaluate(t, t.valid)
    expected_phi = torch.tensor([[4 * math.exp(-3), 8 * math.exp(-2), 4 * math.exp(-3)]])
    assert torch.allclose(out.grad, -expected_phi * torch.tensor([[1.0, -1.0, 0.0]]), rtol=1e-6)
    assert out.counts["vespo/phi_mean"].item() == pytest.approx(expected_phi.sum().item(), rel=1e-6)
    assert out.counts["vespo/phi_below_half_fraction"].item() == 2.0  # the two tokens with 4 e^{-3}


# ---------------------------------------------------------------------------------------------------- autograd


def random_tokens(seed: int, B: int = 6, T: int = 9, per_token: bool = False, rollout: bool = False):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g) * 3.0 - 3.0  # within [-6, -3]: the old and rollout log-probs stay below 0
    old = lp + 0.7 * torch.randn(B, T, generator=g)  # log W spreads over +-2 and more: phi from ~0 to above 1
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = 0, T  # an all-padding row and a full one
    mask = torch.arange(T) < lengths[:, None]
    adv = torch.randn(B, T, generator=g) if per_token else torch.randn(B, generator=g)
    rollout_lp = old + 0.3 * torch.randn(B, T, generator=g) if rollout else None
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, rollout_logprobs=rollout_lp)
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(adv)
    return t


def reference(t: Tokens, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, rollout_cap=None, fold=False,
              rollout_floor=None, bounds="truncate"):
    """The paper's loss written out in float64 with autograd: sum_t weight_t * (-sg(phi) A_t log p_t).

    With ``fold``, the rollout ratio in ratio space as TRL computes it: exp(old - rollout), then
    clamped into [floor, cap] (truncate) or zeroed outside it (mask), then log and clamp to [log 1e-8, 20]."""
    valid = t.valid_bool
    lp = t.logprobs.double().requires_grad_()
    log_r = (lp - t.old_logprobs.double()).clamp(-20.0, 20.0)
    log_w = torch.where(valid, log_r, 0.0).sum(-1, keepdim=True)
    if fold:
        gap = t.old_logprobs.double() - t.rollout_logprobs.double()
        ratio = gap.exp()
        if bounds == "truncate" and (rollout_floor, rollout_cap) != (None, None):
            ratio = ratio.clamp(min=rollout_floor, max=rollout_cap)
        elif bounds == "mask":
            low = 0.0 if rollout_floor is None else rollout_floor
            high = math.inf if rollout_cap is None else rollout_cap
            ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)  # log 0 = -inf, clamped to log 1e-8
        log_w = log_w + torch.where(valid, ratio.log().clamp(math.log(1e-8), 20.0), 0.0).sum(-1, keepdim=True)
    w = log_w.clamp(math.log(1e-8), 20.0).exp()
    adv = t.advantages.double()
    k = torch.where(adv >= 0, k_pos, k_neg)
    lam = torch.where(adv >= 0, lambda_pos, lambda_neg)
    phi = (w**k * torch.exp(lam * (1.0 - w))).detach()  # the textbook form, not log space
    weight = token_mean(t).double()
    loss = (weight * torch.where(valid, -phi * adv * lp, 0.0)).sum()
    loss.backward()
    return loss.detach(), lp.grad


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, per_token):
    t = random_tokens(seed, per_token=per_token)
    out = VESPO().evaluate(t, token_mean(t))
    ref, ref_grad = reference(t)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(out.grad.double(), ref_grad, atol=1e-7, rtol=1e-5)
    phi = phi_of(t)[t.valid_bool]
    assert (phi < 0.5).any() and (phi > 0.9).any()  # both ends of the kernel are exercised


@pytest.mark.parametrize("cap", [None, 1.2])
@pytest.mark.parametrize("seed", range(3))
def test_rollout_correction_matches_autograd(seed, cap):
    t = random_tokens(seed, rollout=True)
    component = VESPO(rollout_correction=True, rollout_cap=cap)
    out = component.evaluate(t, token_mean(t))
    ref, ref_grad = reference(t, fold=True, rollout_cap=cap)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(out.grad.double(), ref_grad, atol=1e-7, rtol=1e-5)
    plain = VESPO().evaluate(t, token_mean(t))
    assert (out.loss - plain.loss).abs() > 1e-4  # the rollout ratio did enter W


@pytest.mark.parametrize("bounds", ["truncate", "mask"])
@pytest.mark.parametrize("seed", range(3))
def test_rollout_band_matches_autograd(seed, bounds):
    t = random_tokens(seed, rollout=True)
    component = VESPO(rollout_correction=True, rollout_cap=1.2, rollout_floor=0.8, rollout_bounds=bounds)
    out = component.evaluate(t, token_mean(t))
    ref, ref_grad = reference(t, fold=True, rollout_cap=1.2, rollout_floor=0.8, bounds=bounds)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(out.grad.double(), ref_grad, atol=1e-7, rtol=1e-5)
    gap = (t.old_logprobs - t.rollout_logprobs)[t.valid_bool].exp()
    assert ((gap < 0.8) | (gap > 1.2)).any()  # the band did bind


def test_rollout_correction_multiplies_w_by_the_rollout_ratio():
    # log r = 0, old - rollout = log 2 on the one token: W = pi_theta / pi_rollout = 2, phi = 4 e^{-3} (A > 0)
    t = tokens([[0.0]], [1.0], rollout_gap=[[LOG2]])
    assert phi_of(t, rollout_correction=True).item() == pytest.approx(4 * math.exp(-3), rel=1e-6)
    assert phi_of(t).item() == pytest.approx(1.0)  # off: the rollout log-probs are not read
    # capped at 1.5: W = 1.5, phi = e^3 1.5^2 e^{-4.5} = 2.25 e^{-1.5} = 0.502052
    assert phi_of(t, rollout_correction=True, rollout_cap=1.5).item() == pytest.approx(2.25 * math.exp(-1.5), rel=1e-6)


def test_rollout_floor_and_mask_by_hand():
    # One token, log r = 0, pi_old / pi_rollout = 1/2 (old - rollout = -log 2), A = 1 (k = 2, lambda = 3).
    t = tokens([[0.0]], [1.0], rollout_gap=[[-LOG2]])
    # no band: W = 1/2, phi = e^3 (1/4) e^{-1.5} = e^{1.5} / 4 = 1.120422
    assert phi_of(t, rollout_correction=True).item() == pytest.approx(math.exp(1.5) / 4, rel=1e-6)
    # truncate at floor 0.8: W = 0.8, phi = e^3 0.64 e^{-2.4} = 0.64 e^{0.6} = 1.166151
    assert phi_of(t, rollout_correction=True, rollout_floor=0.8).item() == pytest.approx(0.64 * math.exp(0.6), rel=1e-6)
    # mask outside [0.8, 3]: the ratio becomes 0, log 0 clamped to log 1e-8: W = 1e-8,
    # phi = e^3 (1e-8)^2 e^{-3e-8} = e^3 1e-16 = 2.0085537e-15: the response stops training
    masked = phi_of(t, rollout_correction=True, rollout_floor=0.8, rollout_cap=3.0, rollout_bounds="mask").item()
    assert masked == pytest.approx(math.exp(3) * 1e-16, rel=1e-5)
    # inside the band the mask leaves the ratio as it is: pi_old / pi_rollout = 2 in [0.8, 3]: W = 2, phi = 4 e^{-3}
    t = tokens([[0.0]], [1.0], rollout_gap=[[LOG2]])
    kept = phi_of(t, rollout_correction=True, rollout_floor=0.8, rollout_cap=3.0, rollout_bounds="mask").item()
    assert kept == pytest.approx(4 * math.exp(-3), rel=1e-6)


def test_a_rollout_logprob_of_nan_counts_as_no_mismatch():
    # TRL: nan_to_num(old - sampling) = 0, ratio 1. Here too: W = r = 2 (log r = log 2), phi = 4 e^{-3}
    t = tokens([[LOG2]], [1.0], rollout_gap=[[math.nan]])
    assert phi_of(t, rollout_correction=True, rollout_cap=3.0).item() == pytest.approx(4 * math.exp(-3), rel=1e-6)


# ---------------------------------------------------------------------------------------------------- padding


def poisoned(t: Tokens, value: float) -> Tokens:
    """The same micro-batch with ``value`` in every padding position of every input."""
    b = t.batch
    pad = ~b.response_mask

    def fill(x):
        return None if x is None else torch.where(pad, value, x)

    adv = b.advantages.unsqueeze(-1).expand_as(b.logprobs) if b.advantages.dim() == 1 else b.advantages
    batch = rlstab.TokenBatch(
        logprobs=fill(b.logprobs), old_logprobs=fill(b.old_logprobs), advantages=fill(adv),
        response_mask=b.response_mask, rollout_logprobs=fill(b.rollout_logprobs),
    )
    out = Tokens.from_batch(batch, t.log_ratio_clamp)
    out.set_advantages(batch.advantages)
    return out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e30])
@pytest.mark.parametrize("fold", [False, True])
def test_padding_changes_nothing_whatever_it_holds(value, fold):
    t = random_tokens(0, per_token=True, rollout=True)
    component = VESPO(rollout_correction=fold)
    clean = component.evaluate(t, token_mean(t))
    dirty = component.evaluate(poisoned(t, value), token_mean(t))
    assert torch.equal(dirty.loss, clean.loss)
    assert torch.equal(dirty.grad, clean.grad)
    assert all(torch.equal(dirty.counts[k], clean.counts[k]) for k in clean.counts)
    assert torch.equal(dirty.grad[~t.valid_bool], torch.zeros(int((~t.valid_bool).sum())))


def test_length_one_and_all_padding_rows():
    # Row 0: one valid token, log r = log 2, A = 1: phi = 4 e^{-3}. Row 1: all padding (its values are junk).
    t = tokens([[LOG2, 5.0], [7.0, -9.0]], [1.0, -3.0], mask=[[True, False], [False, False]], logprobs=[[-2.0, 0.0], [-1.0, -1.0]])
    out = VESPO().evaluate(t, token_mean(t))  # N = 1
    phi = 4 * math.exp(-3)
    assert out.loss.item() == pytest.approx(-phi * 1.0 * -2.0, rel=1e-6)  # only row 0's token: 2 phi = 0.398297
    assert torch.allclose(out.grad, torch.tensor([[-phi, 0.0], [0.0, 0.0]]), rtol=1e-6)
    assert out.counts["vespo/phi_mean"].item() == pytest.approx(phi, rel=1e-6)  # over the 1 valid token
    assert out.counts["vespo/phi_below_half_fraction"].item() == 1.0


def test_an_all_padding_batch_gives_zeros():
    t = tokens([[1.0, 2.0]], [1.0], mask=[[False, False]])
    out = VESPO().evaluate(t, token_mean(t))
    assert out.loss.item() == 0.0
    assert torch.equal(out.grad, torch.zeros(1, 2))
    assert all(v.item() == 0.0 for v in out.counts.values())


# ---------------------------------------------------------------------------------------------------- the component


def test_defaults_reads_and_description():
    v = VESPO()
    assert isinstance(v, Surrogate) and v.kind == "vespo"
    assert (v.k_pos, v.lambda_pos, v.k_neg, v.lambda_neg) == (2.0, 3.0, 3.0, 2.0)
    assert v.reads == frozenset()
    assert VESPO(rollout_correction=True).reads == frozenset({"rollout_logprobs"})
    line = VESPO(k_pos=1.5, lambda_pos=2.5, k_neg=3.5, lambda_neg=4.5, rollout_correction=True, rollout_cap=3.0).describe()
    assert "\n" not in line
    masked = VESPO(rollout_correction=True, rollout_floor=0.5, rollout_cap=2.0, rollout_bounds="mask").describe()
    assert "1e-8 outside [0.5, 2]" in masked
    for number in ("1.5", "2.5", "3.5", "4.5", "clamped to [0, 3]", "pi_rollout"):
        assert number in line, (number, line)
    for name, field in VESPO.model_fields.items():
        assert name == "kind" or field.description, name  # every parameter carries its docstring


@pytest.mark.parametrize(
    "fields",
    [
        {"k_pos": -1.0},
        {"k_neg": 101.0},
        {"lambda_pos": 0.0},
        {"lambda_neg": -2.0},
        {"k_pos": math.nan},
        {"k_pos": "2"},  # strict: no string coercion
        {"rollout_correction": True, "rollout_cap": 0.9},  # the band must contain 1
        {"rollout_correction": True, "rollout_floor": 1.1},
        {"rollout_correction": True, "rollout_floor": 0.0},
        {"rollout_cap": 3.0},  # a cap without the correction it caps
        {"rollout_floor": 0.5},
        {"rollout_correction": True, "rollout_bounds": "mask"},  # a mask without a band
        {"kapa_pos": 2.0},  # a typo is an error, not a silently ignored key
    ],
)
def test_invalid_fields_are_refused(fields):
    with pytest.raises(ValidationError):
        VESPO(**fields)


def test_the_entry_point_is_rlstabs_own():
    (ep,) = entry_points(group="rlstab.components", name="vespo")  # one: no plugin ships it a second time
    assert ep.value == "rlstab.clipping.vespo:VESPO"
    assert ep.load() is VESPO
    assert ep.name == VESPO.model_fields["kind"].default


def test_the_preset_runs_the_formula():
    """Through rlstab.load("vespo"): the token mean of -phi A log p over valid tokens, TRL's defaults."""
    objective = rlstab.load("vespo")
    assert objective.surrogate == VESPO(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
    assert objective.aggregation.kind == "token-mean" and objective.aggregation.count == "valid"
    t = random_tokens(1)
    logprobs = t.batch.logprobs.clone().requires_grad_()
    batch = rlstab.TokenBatch(
        logprobs=logprobs, old_logprobs=t.batch.old_logprobs, advantages=t.batch.advantages,
        response_mask=t.batch.response_mask,
    )
    out = objective.compile()(batch)
    out.loss.backward()
    ref, ref_grad = reference(t)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(logprobs.grad.double(), ref_grad, atol=1e-7, rtol=1e-5)
    assert 0.0 < out.metrics["vespo/phi_mean"] < 1.5


def test_vespo_passes_rlstabs_conformance_kit():
    # YAML round trip, describe/explain, JSON Schema, padding, micro-batches == step, 2 gloo ranks == 1 process.
    check_component(VESPO())
    check_component(VESPO(k_pos=1.5, lambda_neg=4.0, rollout_correction=True, rollout_cap=3.0))
    check_component(VESPO(rollout_correction=True, rollout_floor=0.5, rollout_cap=2.0, rollout_bounds="mask"))
