"""DRO: hand-computed values, and the closed-form gradient against autograd."""

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, rlstab_loss_and_grad, token_mean_reference

import rlstab


def test_hand_computed():
    out, grad = one_row([0.5, -1.0, 0.0], [1.0, -2.0, 0.0], {"kind": "dro", "beta": 0.2}, old=-2.0)
    # log p = [-1.5, -3, -2];  log r = [0.5, -1, 0]
    # l = -(A log p - 0.1 (log r)^2) = [-(-1.5 - 0.025), -(6 - 0.1), -(0 - 0)] = [1.525, -5.9, 0]; mean = -1.458333
    assert out.loss.item() == pytest.approx((1.525 - 5.9) / 3, abs=1e-6)
    # dl/dlogp = -A + beta log r = [-1 + 0.1, 2 - 0.2, 0] / 3
    assert torch.allclose(grad, torch.tensor([-0.9, 1.8, 0.0]) / 3, atol=1e-7)


def test_penalty_acts_at_zero_advantage():
    # A = 0: the penalty alone pulls log p back towards log p_old: dl/dlogp = beta * log r
    _, grad = one_row([2.0], [0.0], {"kind": "dro", "beta": 0.5}, old=-3.0)  # log-prob -1: at most 0
    assert grad.item() == pytest.approx(1.0)


def test_penalty_uses_the_unclamped_log_ratio():
    # log r = 30 beyond the objective's clamp (20): the pull back is beta * 30, not beta * 20
    out, grad = one_row([30.0], [0.0], {"kind": "dro", "beta": 0.1}, old=-40.0)
    assert grad.item() == pytest.approx(3.0)
    assert out.loss.item() == pytest.approx(0.05 * 900)


@pytest.mark.parametrize("beta", [0.05, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_closed_form_gradient_matches_autograd(seed, beta):
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad({"kind": "dro", "beta": beta}, batch)

    def per_token(lp):
        return -(lp * batch.advantages - 0.5 * beta * (lp - batch.old_logprobs) ** 2)

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-7)


def test_masked_tokens_get_no_penalty():
    lp = torch.tensor([[-1.0, 1e30]]).requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=torch.tensor([[-2.0, -1e30]]), advantages=torch.tensor([0.0]),
                              response_mask=torch.tensor([[True, False]]))
    objective = rlstab.load({"surrogate": {"kind": "dro", "beta": 1.0}, "aggregation": {"kind": "token-mean", "count": "valid"}})
    out = objective.compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert out.loss.item() == pytest.approx(0.5)  # 0.5 * 1 * 1^2 on the one valid token
    assert grad.tolist() == [[1.0, 0.0]]


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_beta_must_be_positive(beta):
    with pytest.raises(rlstab.ConfigError, match="surrogate.*beta"):
        rlstab.load({"surrogate": {"kind": "dro", "beta": beta}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_preset():
    o = rlstab.load("dro")
    assert (o.surrogate.kind, o.surrogate.beta) == ("dro", 0.05)
    assert o.advantage.kind == "grpo" and o.advantage.normalize_std is False
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
