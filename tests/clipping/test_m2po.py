"""M2PO: hand-computed cuts (the authors' cap rule and Algorithm 1's removal), hand-computed losses, the
step-wide cut over micro-batches, and the closed-form gradient against autograd with a brute-force mask."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab
from rlstab.clipping.m2po import M2PO

from step_worker import take

AGG = {"kind": "token-mean", "count": "valid"}
CAP = {"kind": "m2po", "threshold": 0.04}
REMOVE = {"kind": "m2po", "threshold": 0.04, "rule": "remove"}


def cut(rule, values, tau=0.04):
    return M2PO(rule=rule, threshold=tau)._cut(torch.tensor(sorted(values), dtype=torch.float64))


def test_cap_rule_by_hand():
    # v = [0.01, 0.06, 0.065, 0.07]: mean 0.05125 > 0.04; budget sum tau n = 0.16
    # sum_j min(v_j, x) at x = v_k: k = 0: 0.01 * 4 = 0.04;  k = 1: 0.01 + 0.06 * 3 = 0.19 >= 0.16  ->  x* = 0.06
    # T = 0.01 (the value below), M2 after = (0.01 + 0.01 * 3) / 4 = 0.01; three tokens go
    x, T, m2, after, n, masked = cut("cap", [0.07, 0.01, 0.065, 0.06])
    assert (x, T, n, masked) == pytest.approx((0.06, 0.01, 4, 3))
    assert (m2, after) == pytest.approx((0.05125, 0.01))


def test_remove_rule_by_hand():
    # v - tau = [-0.03, 0.02, 0.025, 0.03]; prefix sums -0.03, -0.01, 0.015 > 0 at the third: x* = 0.065
    # kept 0.01, 0.06 (mean 0.035 <= 0.04), M2 after = 0.035; two tokens go
    x, T, m2, after, n, masked = cut("remove", [0.07, 0.01, 0.065, 0.06])
    assert (x, n, masked) == pytest.approx((0.065, 4, 2))
    assert math.isinf(T)
    assert (m2, after) == pytest.approx((0.05125, 0.035))


@pytest.mark.parametrize("rule", ["cap", "remove"])
def test_within_budget_masks_nothing(rule):
    x, _, m2, after, n, masked = cut(rule, [0.01, 0.02, 0.05])  # mean 0.026667 <= 0.04
    assert math.isinf(x) and masked == 0 and m2 == after == pytest.approx(0.08 / 3)


def test_every_value_over_budget():
    # cap: 0.05 * 2 = 0.1 >= tau n = 0.08 at k = 0: x* = 0.05, T = 0 (the authors' tau = 0): all go
    assert cut("cap", [0.05, 0.06])[:2] == pytest.approx((0.05, 0.0))
    # remove: 0.05 - 0.04 > 0 already: x* = 0.05, all go (as Trinity-RFT; AReaL would keep one)
    assert cut("remove", [0.05, 0.06])[5] == 2


# One response, old log-prob -1. (log r, A): the trust region is A > 0, r > 1 or A < 0, r < 1.
#   1: (0.1, +1) v = 0.01   2: (0.2, +1) v = 0.04   3: (0.5, +1) v = 0.25   4: (-0.3, -1) v = 0.09
#   5: (-0.6, +1) not in it   6: (0.4, -1) not in it
ROW = ([0.1, 0.2, 0.5, -0.3, -0.6, 0.4], [1.0, 1.0, 1.0, -1.0, 1.0, -1.0])


def test_cap_loss_by_hand():
    out, grad = one_row(*ROW, CAP)
    # population [0.01, 0.04, 0.09, 0.25], mean 0.0975 > 0.04, tau n = 0.16:
    #   k = 0: 0.04;  k = 1: 0.01 + 0.04 * 3 = 0.13;  k = 2: 0.05 + 0.09 * 2 = 0.23 >= 0.16: x* = 0.09, T = 0.04
    # tokens 3 and 4 go, at the authors' clipped value -A clip(r, e^-0.2, e^0.2):
    #   3: -1 * e^0.2 = -1.221403;  4: +1 * e^-0.2 = 0.818731   (no gradient)
    # others -A r: 1: -e^0.1 = -1.105171;  2: -e^0.2 = -1.221403;  5: -e^-0.6 = -0.548812;  6: e^0.4 = 1.491825
    # token-mean: (-1.105171 - 1.221403 - 1.221403 + 0.818731 - 0.548812 + 1.491825) / 6 = -1.786233 / 6
    assert out.loss.item() == pytest.approx(-1.786233 / 6, abs=1e-6)
    e = math.exp
    assert torch.allclose(grad, torch.tensor([-e(0.1), -e(0.2), 0.0, 0.0, -e(-0.6), e(0.4)]) / 6, atol=1e-7)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 6)
    assert out.metrics["clip/low_fraction"] == pytest.approx(1 / 6)
    assert out.metrics["surrogate/m2"] == pytest.approx(0.0975)
    assert out.metrics["surrogate/m2_after"] == pytest.approx((0.01 + 0.04 * 3) / 4)  # capped at T = 0.04
    assert (out.metrics["surrogate/population"], out.metrics["surrogate/masked"]) == (4, 2)


def test_remove_loss_by_hand():
    out, grad = one_row(*ROW, REMOVE)
    # prefix sums of v - 0.04: -0.03, -0.03, 0.02 > 0 at 0.09: x* = 0.09, tokens 3 and 4 go and contribute 0
    # token-mean: (-1.105171 - 1.221403 - 0.548812 + 1.491825) / 6 = -1.383561 / 6
    assert out.loss.item() == pytest.approx(-1.383561 / 6, abs=1e-6)
    assert out.metrics["surrogate/m2_after"] == pytest.approx(0.025)  # mean of 0.01 and 0.04
    e = math.exp
    assert torch.allclose(grad, torch.tensor([-e(0.1), -e(0.2), 0.0, 0.0, -e(-0.6), e(0.4)]) / 6, atol=1e-7)


def test_valid_population():
    out, _ = one_row(*ROW, {**REMOVE, "population": "valid"})
    # all six: v = [0.01, 0.04, 0.25, 0.09, 0.36, 0.16] sorted 0.01, 0.04, 0.09, 0.16, ...;
    # prefix sums of v - 0.04: -0.03, -0.03, 0.02 > 0 at 0.09: tokens 3, 4, 5, 6 go
    # token-mean: (-1.105171 - 1.221403) / 6
    assert out.loss.item() == pytest.approx((-math.exp(0.1) - math.exp(0.2)) / 6, abs=1e-6)
    assert out.metrics["clip/high_fraction"] == pytest.approx(2 / 6)  # tokens 3 and 5 (A > 0)


def brute_force_mask(batch, rule, population, tau=0.04):
    """The authors' loop (cap) or Trinity-RFT's prefix means (remove) over the whole batch, as a [B, T] keep."""
    lr = (batch.logprobs - batch.old_logprobs).detach().clamp(-20, 20)
    A, valid = batch.advantages, batch.response_mask
    member = valid & (((A > 0) & (lr > 0)) | ((A < 0) & (lr < 0))) if population == "trust_region" else valid
    v = lr.square()
    s = sorted(v[member].double().tolist())
    n = len(s)
    x = math.inf
    if rule == "cap" and sum(s) / n > tau:
        for k in range(n):  # core_algos.py _solve_tau_from_sorted_delta2, without the 1e-12 tolerances
            if s[k] * (n - k - 1) + sum(s[: k + 1]) >= tau * n:
                x = s[k]
                break
    if rule == "remove":
        means = [sum(s[: k + 1]) / (k + 1) for k in range(n)]
        keep = sum(m <= tau for m in means)
        x = s[keep] if keep < n else math.inf
    return ~(member & (v >= x)), x


@pytest.mark.parametrize("population", ["trust_region", "valid"])
@pytest.mark.parametrize("rule", ["cap", "remove"])
@pytest.mark.parametrize("seed", range(3))
def test_closed_form_gradient_matches_autograd(seed, rule, population):
    batch = off_policy_batch(seed, spread=0.6)
    config = {"kind": "m2po", "rule": rule, "population": population}
    out, grad = rlstab_loss_and_grad(config, batch)
    keep, x = brute_force_mask(batch, rule, population)
    assert not math.isinf(x)  # the budget binds on these batches
    member_v = (batch.logprobs - batch.old_logprobs).detach().square()
    lr_all = (batch.logprobs - batch.old_logprobs).detach()
    A, valid = batch.advantages, batch.response_mask
    m = valid & (((A > 0) & (lr_all > 0)) | ((A < 0) & (lr_all < 0))) if population == "trust_region" else valid
    T = max([v for v in member_v[m].tolist() if v < x], default=0.0)

    def per_token(lp):
        r = ratio(lp, batch)
        kept = torch.where(keep, -A * r, 0.0)
        if rule == "remove":
            return kept
        # the authors' PPO clip at exp(+-sqrt T): the masked tokens keep the clipped value, without gradient
        return torch.where(keep, kept, -A * r.clamp(math.exp(-math.sqrt(T)), math.exp(math.sqrt(T))).detach())

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    assert out.metrics["surrogate/masked"] == (~keep & valid).sum().item()


SPLITS = [(0, 3), (3, 8), (8, 12)]


@pytest.mark.parametrize("rule", ["cap", "remove"])
def test_the_cut_spans_the_whole_step(rule):
    batch = off_policy_batch(4, spread=0.6)
    fn = rlstab.load({"surrogate": {"kind": "m2po", "rule": rule}, "aggregation": AGG}).compile()
    whole = fn(batch)
    (whole_grad,) = torch.autograd.grad(whole.loss, batch.logprobs)
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = [take(batch, lo, hi, leaf) for lo, hi in SPLITS]
    stats = fn.gather(micro)
    total = 0.0
    for mb in micro:
        out = fn(mb, step=stats)
        out.loss.backward()
        total += out.loss.item()
        assert out.metrics["surrogate/m2"] == whole.metrics["surrogate/m2"]
    assert total == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(leaf.grad, whole_grad, atol=1e-7)
    # each micro-batch alone (the authors' scope) would cut elsewhere
    assert {fn(mb).metrics["surrogate/m2"] for mb in micro} != {whole.metrics["surrogate/m2"]}


def test_all_padding_gives_zero():
    batch = off_policy_batch(1)
    empty = rlstab.TokenBatch(
        logprobs=batch.logprobs.detach().clone().requires_grad_(), old_logprobs=batch.old_logprobs,
        advantages=batch.advantages, response_mask=torch.zeros_like(batch.response_mask),
    )
    out, grad = rlstab_loss_and_grad(CAP, empty)
    assert out.loss.item() == 0.0 and torch.count_nonzero(grad) == 0
    assert out.metrics["surrogate/population"] == 0


@pytest.mark.parametrize(("field", "value"), [("threshold", 0.0), ("rule", "clip"), ("population", "all")])
def test_configuration_is_checked(field, value):
    with pytest.raises(rlstab.ConfigError, match=f"surrogate.*{field}"):
        rlstab.load({"surrogate": {"kind": "m2po", field: value}, "aggregation": AGG})


def test_preset():
    o = rlstab.load("m2po")
    assert (o.surrogate.threshold, o.surrogate.population, o.surrogate.rule) == (0.04, "trust_region", "cap")
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert o.advantage.kind == "grpo"
