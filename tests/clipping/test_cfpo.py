"""CFPO: hand-computed values (the authors' veRL loss), the closed-form gradient against autograd, padding."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

CFPO = {"kind": "cfpo", "epsilon": 0.2}


def test_hand_computed():
    out, grad = one_row([0.5, 0.0, -0.5, 0.1], [1.0, -2.0, -1.0, 0.5], CFPO)
    # r = [e^0.5, 1, e^-0.5, e^0.1] = [1.6487213, 1, 0.6065307, 1.1051709];  1 / (2 eps) = 2.5
    # l = -A r + 2.5 |A| (r - 1)^2:
    #   -1.6487213 + 2.5 * 0.6487213^2 = -1.6487213 + 1.0520982 = -0.5966231
    #   -(-2) * 1 + 0                                            =  2
    #   0.6065307 + 2.5 * 0.3934693^2 = 0.6065307 + 0.3870453   =  0.9935760
    #   -0.5 * 1.1051709 + 1.25 * 0.1051709^2 = -0.5525855 + 0.0138262 = -0.5387593
    # token-mean: (-0.5966231 + 2 + 0.9935760 - 0.5387593) / 4 = 1.8581936 / 4 = 0.4645484
    assert out.loss.item() == pytest.approx(0.4645484, abs=1e-6)
    # dl/dlogp = -r (A - |A| (r - 1) / eps), eps = 0.2:
    #   -1.6487213 * (1 - 5 * 0.6487213) = -1.6487213 * -2.2436064 = 3.6990815 (beyond 1 + eps: pulled back)
    #   -1 * (-2 - 0) = 2
    #   -0.6065307 * (-1 + 5 * 0.3934693) = -0.6065307 * 0.9673467 = -0.5867254 (beyond 1 - eps, A < 0: pulled back up)
    #   -1.1051709 * (0.5 - 2.5 * 0.1051709) = -1.1051709 * 0.2370727 = -0.2620059
    expected = torch.tensor([3.6990815, 2.0, -0.5867254, -0.2620059]) / 4
    assert torch.allclose(grad, expected, atol=1e-6)
    # the tokens PPO would have clipped (the PR's pg_clipfrac): A > 0 with r > 1.2 (token 1); A < 0 with r < 0.8 (token 3)
    assert out.metrics["clip/high_fraction"] == 0.25
    assert out.metrics["clip/low_fraction"] == 0.25


@pytest.mark.parametrize(("log_ratio", "advantage"), [(math.log(1.2), 1.0), (math.log(0.8), -1.0), (math.log(1.2), 3.0)])
def test_the_objective_peaks_at_the_clip_boundary(log_ratio, advantage):
    # d/dr [A r - |A| (r - 1)^2 / (2 eps)] = A - |A| (r - 1) / eps = 0 at r = 1 + eps sign(A)
    _, grad = one_row([log_ratio], [advantage], CFPO)
    assert grad.item() == pytest.approx(0.0, abs=1e-6)


def test_on_policy_it_is_the_policy_gradient():
    # r = 1: the penalty and its slope vanish, l = -A, dl/dlogp = -A
    out, grad = one_row([0.0, 0.0], [2.0, -0.5], CFPO)
    assert out.loss.item() == pytest.approx((-2.0 + 0.5) / 2)
    assert torch.allclose(grad, torch.tensor([-2.0, 0.5]) / 2)


def test_a_clamped_log_ratio_has_no_gradient():
    # log r = 30 is clamped to 20 (veRL's clamp, the PR's line 1295): the clamp's derivative is 0 there
    out, grad = one_row([30.0, -30.0], [1.0, -1.0], CFPO, old=-40.0)
    assert torch.all(grad == 0.0)
    assert math.isfinite(out.loss.item())


@pytest.mark.parametrize("epsilon", [0.2, 0.05, 1.0])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, epsilon):
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad({"kind": "cfpo", "epsilon": epsilon}, batch)

    def per_token(lp):  # the authors' loss: -(A r - |A| (r - 1)^2 / (2 eps))
        r = ratio(lp, batch)
        a = batch.advantages
        return -(a * r - a.abs() * (r - 1) ** 2 / (2 * epsilon))

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6, rtol=1e-5)


def test_per_response_advantages_match_per_token():
    batch = off_policy_batch(1)
    rows = torch.randn(batch.logprobs.shape[0], generator=torch.Generator().manual_seed(0))
    fields = {f: getattr(batch, f) for f in ("logprobs", "old_logprobs", "response_mask")}
    a, ga = rlstab_loss_and_grad(CFPO, rlstab.TokenBatch(**fields, advantages=rows))
    b, gb = rlstab_loss_and_grad(CFPO, rlstab.TokenBatch(**fields, advantages=rows[:, None].expand_as(batch.logprobs)))
    assert a.loss.item() == pytest.approx(b.loss.item(), abs=1e-6)
    assert torch.allclose(ga, gb, atol=1e-7)


def test_padding_holding_huge_values_changes_nothing():
    batch = off_policy_batch(2)
    pad = ~batch.response_mask
    logprobs = batch.logprobs.detach().masked_fill(pad, 1e30).requires_grad_()
    old = batch.old_logprobs.masked_fill(pad, -1e30)
    advantages = batch.advantages.masked_fill(pad, 1e30)
    noisy = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=advantages, response_mask=batch.response_mask)
    a, ga = rlstab_loss_and_grad(CFPO, batch)
    b, gb = rlstab_loss_and_grad(CFPO, noisy)
    assert b.loss.item() == pytest.approx(a.loss.item(), abs=1e-6)
    assert torch.equal(gb[pad], torch.zeros_like(gb[pad]))
    assert torch.allclose(gb[~pad], ga[~pad], atol=1e-7)


@pytest.mark.parametrize("value", [0.0, -0.2])
def test_epsilon_must_be_positive(value):
    with pytest.raises(rlstab.ConfigError, match="surrogate.*epsilon"):
        rlstab.load({"surrogate": {"kind": "cfpo", "epsilon": value}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_preset():
    o = rlstab.load("cfpo")
    assert (o.surrogate.kind, o.surrogate.epsilon) == ("cfpo", 0.2)
    assert (o.advantage.kind, o.aggregation.kind, o.aggregation.count) == ("grpo", "token-mean", "valid")
    assert o.regularisers == [] and o.masks == []
