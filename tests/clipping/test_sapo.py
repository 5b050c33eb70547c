"""SAPO: hand-computed values from the paper's gate, and the closed-form gradient against autograd."""

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab

SAPO = {"kind": "sapo", "tau_pos": 1.0, "tau_neg": 1.05}


def test_hand_computed_gate():
    out, grad = one_row([0.0, 0.5, -1.0, 0.3], [1.0, -1.0, 2.0, 0.0], SAPO)
    # token  tau   r = e^{log r}  x = tau (r - 1)  s = sigmoid(x)  l = -A (4/tau) s     dl/dlogp = -A 4 s (1-s) r
    # A=+1   1     1              0                0.5             -2                   -1
    # A=-1   1.05  1.6487213      0.6811573        0.6639970       4/1.05*0.664 = 2.5295122   1 * 4*0.664*0.336 * 1.6487 = 1.4713518
    # A=+2   1     0.3678794      -0.6321206       0.3470299       -2 * 4 * 0.347 = -2.7762389   -2 * 0.9064005 * 0.3679 = -0.6668923
    # A= 0   1.05  1.3498588      0.3673517        0.5908189       0                    0
    # token-mean over 4 tokens
    assert out.loss.item() == pytest.approx((-2.0 + 2.5295122 - 2.7762389 + 0.0) / 4, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([-1.0, 1.4713518, -0.6668923, 0.0]) / 4, atol=1e-6)
    # gradient weights 4 s (1 - s): 1, 0.8924200, 0.9064005, 0.9670077 -> mean 0.9414571
    assert out.metrics["sapo/gradient_weight_mean"] == pytest.approx(0.9414571, abs=1e-6)


def test_on_policy_it_is_the_policy_gradient():
    # r = 1: s = 1/2, gradient weight 4 * 1/4 = 1 whatever tau: dl/dlogp = -A, as REINFORCE
    out, grad = one_row([0.0, 0.0], [0.7, -1.3], {"kind": "sapo", "tau_pos": 3.0, "tau_neg": 0.5})
    assert torch.allclose(grad, torch.tensor([-0.7, 1.3]) / 2, atol=1e-7)


def test_negative_tokens_use_tau_neg():
    # Same |A|, same r, opposite signs: only tau differs. A larger tau flattens the gate sooner.
    pos_out, pos_grad = one_row([1.0], [1.0], {"kind": "sapo", "tau_pos": 1.0, "tau_neg": 5.0})
    neg_out, neg_grad = one_row([1.0], [-1.0], {"kind": "sapo", "tau_pos": 1.0, "tau_neg": 5.0})
    # r = e = 2.7182818; A>0: x = 1.7182818, s = 0.8479, 4 s(1-s) = 0.5158, grad -0.5158 * e = -1.4021
    # A<0: x = 8.5914091, s = 0.99981, 4 s(1-s) = 7.4e-4, grad +7.4e-4 * e = 2.0e-3
    assert pos_grad.item() == pytest.approx(-1.40213, abs=1e-4)
    assert neg_grad.item() == pytest.approx(2.0e-3, abs=1e-4)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, aggregation):
    batch = off_policy_batch(seed)
    out, grad = rlstab_loss_and_grad(SAPO, batch, aggregation)

    def per_token(lp):  # the paper's loss, differentiated by autograd
        r = ratio(lp, batch)
        tau = torch.where(batch.advantages > 0, 1.0, 1.05)
        return -batch.advantages * torch.sigmoid(tau * (r - 1)) * 4 / tau

    if aggregation == "token-mean":
        ref, ref_grad = token_mean_reference(per_token, batch)
    else:
        lp = batch.logprobs.detach().clone().requires_grad_()
        m = batch.response_mask.float()
        ref = ((per_token(lp) * m).sum(-1) / m.sum(-1)).mean()
        (ref_grad,) = torch.autograd.grad(ref, lp)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)


def test_temperatures_must_be_positive():
    with pytest.raises(rlstab.ConfigError, match="tau_neg"):
        rlstab.load({"surrogate": {"kind": "sapo", "tau_neg": 0.0}, "aggregation": {"kind": "token-mean", "count": "valid"}})


def test_preset_has_the_paper_values():
    o = rlstab.load("sapo")
    assert (o.surrogate.tau_pos, o.surrogate.tau_neg) == (1.0, 1.05)
    assert (o.aggregation.kind, o.aggregation.count) == ("seq-mean-token-mean", "valid")
