"""Lp-Reg: the min-p proxy by hand, hand-computed losses (the authors' compute_policy_loss_lp_reg), the step-wide
selection, and the closed-form gradient against autograd with a brute-force top-k selection."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, ratio, token_mean_reference

import rlstab
from rlstab.adapters.trainer_parts import unsupplied
from rlstab.clipping.lp_reg import min_p_proxy_logprobs

from step_worker import take

AGG = {"kind": "token-mean", "count": "valid"}


def test_min_p_proxy_by_hand():
    p = torch.tensor([[0.6, 0.3, 0.095, 0.005]])
    # min_p 0.02: threshold 0.02 * 0.6 = 0.012 keeps the first three (mass 0.995)
    # y = 1: log(0.3 / 0.995) = -1.198942;  y = 3 (filtered): -1e4 - log(0.995) = -9999.994987
    proxy = min_p_proxy_logprobs(p.log(), torch.tensor([1]), 0.02)
    assert proxy.item() == pytest.approx(math.log(0.3 / 0.995), abs=1e-6)
    assert min_p_proxy_logprobs(p.log(), torch.tensor([3]), 0.02).item() == pytest.approx(-1e4 - math.log(0.995), abs=1e-2)
    # everything kept (min_p 0.001): the proxy is the distribution itself
    assert min_p_proxy_logprobs(p.log(), torch.tensor([3]), 0.001).item() == pytest.approx(math.log(0.005), abs=1e-6)


def row(logprobs, old, advantages, proxy):
    lp = torch.tensor([logprobs]).requires_grad_()
    return rlstab.TokenBatch(
        logprobs=lp, old_logprobs=torch.tensor([old]), advantages=torch.tensor([advantages]),
        response_mask=torch.ones(1, len(logprobs), dtype=torch.bool), proxy_logprobs=torch.tensor([proxy]),
    )


def run(surrogate, batch):
    out = rlstab.load({"surrogate": surrogate, "aggregation": AGG}).compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    return out, grad[0]


# (log p, old log p, A, log p_proxy)
#   1: -3.0, -3.2, -1, -2.0   r = e^0.2 = 1.221403, a negative token below its proxy
#   2: -2.5, -2.0, -2, -3.0   r = e^-0.5 = 0.606531, a negative token above its proxy
#   3: -0.5, -0.5, +1, -0.1   r = 1
#   4: -1.0, -4.0, +2, -0.5   r = e^3 = 20.0855 > 10: clipped at 1 + eps_high = 10
ROW = ([-3.0, -2.5, -0.5, -1.0], [-3.2, -2.0, -0.5, -4.0], [-1.0, -2.0, 1.0, 2.0], [-2.0, -3.0, -0.1, -0.5])


def test_hand_computed():
    out, grad = run({"kind": "lp_reg", "negative_fraction": 1.0}, row(*ROW))
    # n- = 2, k = int(2 * 1.0) = 2: both negative tokens are selected; only token 1 has log p < log p_proxy
    # 1: d = -2 - (-3) = 1: k3 = e - 1 - 1 = 0.718282; l = -A r + k3 = 1.221403 + 0.718282 = 1.939685
    #    dl/dlogp = -A r + (1 - e) = 1.221403 - 1.718282 = -0.496879
    # 2: PPO clip [0, 10], A < 0 never clipped: l = 2 * 0.606531 = 1.213061, dl/dlogp = 1.213061
    # 3: l = -1, dl/dlogp = -1;   4: l = -2 * 10 = -20, dl/dlogp = 0
    # token-mean: (1.939685 + 1.213061 - 1 - 20) / 4 = -17.847254 / 4
    assert out.loss.item() == pytest.approx(-17.847254 / 4, abs=1e-5)
    expected = torch.tensor([math.exp(0.2) + 1 - math.e, 2 * math.exp(-0.5), -1.0, 0.0]) / 4
    assert torch.allclose(grad, expected, atol=1e-6)
    assert out.metrics["lp_reg/regularised_fraction"] == pytest.approx(0.25)
    assert out.metrics["clip/high_fraction"] == pytest.approx(0.25)
    assert out.metrics["surrogate/selected_negative"] == 2


def test_default_fraction_selects_nothing_on_few_tokens():
    out, grad = run({"kind": "lp_reg"}, row(*ROW))
    # k = int(2 * 0.01) = 0 (and the authors skip k < 2): plain PPO clip [0, 10]
    # (1.221403 + 1.213061 - 1 - 20) / 4
    assert out.loss.item() == pytest.approx((math.exp(0.2) + 2 * math.exp(-0.5) - 21) / 4, abs=1e-5)
    assert out.metrics["lp_reg/regularised_fraction"] == 0.0


def test_one_selected_token_is_skipped_as_the_authors_do():
    # k = int(2 * 0.5) = 1: max(1, 1) = 1 is not > 1, so no token is regularised
    out, _ = run({"kind": "lp_reg", "negative_fraction": 0.5}, row(*ROW))
    assert out.metrics["lp_reg/regularised_fraction"] == 0.0


def test_kl_clamp_stops_the_gradient():
    # d = -0.5 - (-4) = 3.5: k3 = e^3.5 - 4.5 = 28.6 > 10: the term is 10 and gives no gradient
    out, grad = run({"kind": "lp_reg", "negative_fraction": 1.0},
                    row([-4.0, -3.0], [-4.0, -3.0], [-1.0, -1.0], [-0.5, -9.0]))
    # 1: l = 1 + 10, dl/dlogp = 1;  2: l = 1, dl/dlogp = 1;  token-mean: 12 / 2
    assert out.loss.item() == pytest.approx(6.0, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([0.5, 0.5]), atol=1e-7)


def batch_with_proxy(seed):
    b = off_policy_batch(seed, spread=0.5)
    g = torch.Generator().manual_seed(100 + seed)
    proxy = (b.old_logprobs + torch.randn(b.old_logprobs.shape, generator=g)).clamp(max=0.0)
    return rlstab.TokenBatch(
        logprobs=b.logprobs, old_logprobs=b.old_logprobs, advantages=b.advantages, response_mask=b.response_mask,
        proxy_logprobs=proxy,
    )


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed):
    batch = batch_with_proxy(seed)
    config = {"kind": "lp_reg", "negative_fraction": 0.2, "positive_fraction": 0.1, "coef": 0.5,
              "eps_low": 0.2, "eps_high": 0.28}
    out = rlstab.load({"surrogate": config, "aggregation": AGG}).compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    A, valid, proxy = batch.advantages, batch.response_mask, batch.proxy_logprobs
    lp0 = batch.logprobs.detach()
    selected = torch.zeros_like(valid)
    for side, frac in ((A < 0, 0.2), (A > 0, 0.1)):  # the authors' topk over the whole batch
        idx = (valid & side).reshape(-1).nonzero()[:, 0]
        k = max(1, int(len(idx) * frac))
        if k > 1:
            chosen = idx[lp0.reshape(-1)[idx].topk(k, largest=False).indices]
            selected.view(-1)[chosen] = True
    reg = selected & (lp0 < proxy)
    assert reg.any()

    def per_token(lp):  # compute_policy_loss_lp_reg: PPO clip, replaced on reg by -A r + coef * low_var_kl
        r = ratio(lp, batch)
        ppo = torch.maximum(-A * r, -A * r.clamp(0.8, 1.28))
        kl = proxy - lp
        kld = (torch.exp(kl) - kl - 1).clamp(-10, 10)
        return torch.where(reg, -A * r + 0.5 * kld, ppo)

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)


def test_the_selection_spans_the_whole_step():
    batch = batch_with_proxy(2)
    fn = rlstab.load({"surrogate": {"kind": "lp_reg", "negative_fraction": 0.2}, "aggregation": AGG}).compile()
    whole = fn(batch)
    (whole_grad,) = torch.autograd.grad(whole.loss, batch.logprobs)
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = [take(batch, lo, hi, leaf) for lo, hi in [(0, 3), (3, 8), (8, 12)]]
    stats = fn.gather(micro)
    total = sum((lambda o: (o.loss.backward(), o.loss.item())[1])(fn(mb, step=stats)) for mb in micro)
    assert total == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(leaf.grad, whole_grad, atol=1e-7)


def test_a_batch_without_the_proxy_is_refused():
    b = off_policy_batch(0)
    fn = rlstab.load("lp_reg").compile()
    with pytest.raises(rlstab.BatchError, match="proxy_logprobs"):
        fn(rlstab.TokenBatch(logprobs=b.logprobs, old_logprobs=b.old_logprobs, advantages=b.advantages,
                             response_mask=b.response_mask))


def test_adapters_refuse_it():
    problems = unsupplied(rlstab.load("lp_reg"), {})
    assert len(problems) == 1 and "surrogate (lp_reg) reads TokenBatch.proxy_logprobs" in problems[0]
    assert unsupplied(rlstab.load("grpo"), {}) == []


def test_the_openrlhf_adapter_refuses_it_at_start_up():
    from rlstab.adapters.openrlhf.config import build_objective

    with pytest.raises(rlstab.ConfigError, match=r"surrogate \(lp_reg\) reads TokenBatch.proxy_logprobs"):
        build_objective("lp_reg")


def test_preset():
    o = rlstab.load("lp_reg")
    s = o.surrogate
    assert (s.min_p, s.negative_fraction, s.positive_fraction, s.coef, s.eps_low, s.eps_high) == (0.02, 0.01, 0.0, 1.0, 1.0, 9.0)
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert o.advantage.kind == "grpo"
