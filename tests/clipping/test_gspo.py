"""GSPO: hand-computed values, and the closed-form gradients against autograd of the textbook formulas."""

import math

import pytest
import torch

import rlstab

WIDE = {"eps_low": 0.2, "eps_high": 0.2}  # wide enough that the hand-made ratios below stay inside


def one_row(log_ratios, advantages, surrogate, aggregation="seq-mean-token-mean", old=-1.0):
    """One response with the given token log-ratios and per-token advantages; old log-probs ``old``, low enough
    that every log-prob ``old + log r`` is at most 0."""
    old = torch.full((1, len(log_ratios)), old)
    logprobs = (old + torch.tensor([log_ratios])).requires_grad_()
    batch = rlstab.TokenBatch(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=torch.tensor([advantages]),
        response_mask=torch.ones(1, len(log_ratios), dtype=torch.bool),
    )
    objective = rlstab.load({"surrogate": {"kind": "gspo", **surrogate}, "aggregation": {"kind": aggregation, "count": "valid"}})
    out = objective.compile()(batch)
    out.loss.backward()
    return out, logprobs.grad[0]


@pytest.mark.parametrize("gradient", ["sequence", "token"])
def test_unclipped_sequence_advantage_both_gradients_agree(gradient):
    out, grad = one_row([0.3, -0.1], [1.0, 1.0], {**WIDE, "gradient": gradient})
    s = math.exp(0.1)  # mean log r = (0.3 - 0.1) / 2 = 0.1 -> s = 1.10517, inside [0.8, 1.2]
    # seq-mean-token-mean, one response of 2 tokens: w = 1/2 per token; l = -A s = -s per token
    assert out.loss.item() == pytest.approx(2 * 0.5 * -s)
    # sequence: (sum_t w (-A)) * s / n = (-1) * s / 2;   token: w (-A) s = -s / 2
    assert torch.allclose(grad, torch.tensor([-s / 2, -s / 2]), atol=1e-6)
    assert out.metrics["clip/high_fraction"] == 0.0


def test_clipped_high_has_no_gradient():
    out, grad = one_row([0.3, 0.1], [1.0, 1.0], WIDE)
    # s = exp(0.2) = 1.2214 > 1.2 and A > 0: l = -A * 1.2 = -1.2 per token, constant in logp
    assert out.loss.item() == pytest.approx(-1.2)
    assert torch.equal(grad, torch.zeros(2))
    assert out.metrics["clip/high_fraction"] == 1.0


def test_clipped_low_and_dual_clip():
    out, grad = one_row([-0.3, -0.3], [-1.0, -1.0], WIDE)
    # s = exp(-0.3) = 0.7408 < 0.8 and A < 0: l = -A * 0.8 = 0.8 per token, no gradient
    assert out.loss.item() == pytest.approx(0.8)
    assert torch.equal(grad, torch.zeros(2))
    assert out.metrics["clip/low_fraction"] == 1.0
    out, grad = one_row([1.5, 1.5], [-1.0, -1.0], {**WIDE, "dual_clip": 3.0})
    # s = exp(1.5) = 4.4817 > c = 3 and A < 0: l = min(-A s, -3 A) = 3 per token, no gradient
    assert out.loss.item() == pytest.approx(3.0)
    assert torch.equal(grad, torch.zeros(2))
    assert (out.metrics["clip/dual_fraction"], out.metrics["clip/low_fraction"]) == (1.0, 0.0)
    out, grad = one_row([1.5, 1.5], [-1.0, -1.0], WIDE)
    # without dual-clip the same tokens train: l = -A s = 4.4817, d/dlogp_t = (-1/2 - 1/2) * -s / 2 = s / 2
    assert out.loss.item() == pytest.approx(math.exp(1.5), rel=1e-6)
    assert torch.allclose(grad, torch.full((2,), math.exp(1.5) / 2), atol=1e-5)


def test_per_token_advantages_sequence_and_token_gradients_differ():
    s = math.exp(0.1)  # mean log r = (0.2 - 0.2 + 0.3) / 3 = 0.1, inside [0.8, 1.2] for either sign
    seq, g_seq = one_row([0.2, -0.2, 0.3], [1.0, -2.0, 0.5], WIDE)
    tok, g_tok = one_row([0.2, -0.2, 0.3], [1.0, -2.0, 0.5], {**WIDE, "gradient": "token"})
    # w = 1/3; loss = sum_t w (-A_t) s = s/3 * (-1 + 2 - 0.5) = 0.5 s / 3 = 0.184195 (same value for both)
    assert seq.loss.item() == pytest.approx(0.5 * s / 3)
    assert tok.loss.item() == pytest.approx(0.5 * s / 3)
    # token: w (-A_t) s = s/3 * [-1, 2, -0.5]
    assert torch.allclose(g_tok, torch.tensor([-1.0, 2.0, -0.5]) * s / 3, atol=1e-6)
    # sequence: (sum_t w (-A_t)) * s / n = (0.5 / 3) * s / 3 = 0.0613984 on every token
    assert torch.allclose(g_seq, torch.full((3,), 0.5 * s / 9), atol=1e-6)


def test_clamped_log_ratio_caps_s_and_gets_no_gradient():
    out, grad = one_row([25.0, 0.0], [-1.0, -1.0], WIDE, old=-26.0)
    # log r clamped to 20: mean = (20 + 0) / 2 = 10, s = e^10 = 22026.5; A < 0 without dual-clip: unclipped
    # l = -A s = s per token, w = 1/2: loss = s; gradient (sequence): (sum_t w (-A)) * s / n = s / 2,
    # but only on the unclamped token
    s = math.exp(10.0)
    assert out.loss.item() == pytest.approx(s, rel=1e-6)
    assert grad[0].item() == 0.0
    assert grad[1].item() == pytest.approx(s / 2, rel=1e-6)


def test_padding_is_outside_the_mean():
    old = torch.zeros(1, 3)
    logprobs = torch.tensor([[0.2, 0.0, 5.0]]).requires_grad_()  # the third token is padding
    batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=torch.ones(1),
                              response_mask=torch.tensor([[True, True, False]]))
    objective = rlstab.load({"surrogate": {"kind": "gspo", **WIDE}, "aggregation": {"kind": "seq-mean-token-mean", "count": "valid"}})
    out = objective.compile()(batch)
    out.loss.backward()
    # s = exp((0.2 + 0) / 2) = exp(0.1); loss = -s; padding gets no gradient
    assert out.loss.item() == pytest.approx(-math.exp(0.1))
    assert logprobs.grad[0, 2].item() == 0.0


def test_preset_is_the_paper_setting():
    o = rlstab.load("gspo")
    s = o.surrogate
    assert (s.kind, s.eps_low, s.eps_high, s.dual_clip, s.gradient) == ("gspo", 3e-4, 4e-4, None, "sequence")
    assert (o.aggregation.kind, o.aggregation.count) == ("seq-mean-token-mean", "valid")


def test_dual_clip_must_exceed_the_clip_range():
    with pytest.raises(rlstab.ConfigError, match="dual_clip"):
        rlstab.load({"surrogate": {"kind": "gspo", "eps_high": 0.5, "dual_clip": 1.2},
                     "aggregation": {"kind": "token-mean", "count": "valid"}})


# ----------------------------------------------------------------- closed form against autograd


def textbook(logp, old, adv, valid, weight, eps_low, eps_high, dual_clip, gradient, clamp=20.0):
    """sum_t weight_t * l_t, written as the paper writes it, differentiated by autograd."""
    log_r = (logp - old).clamp(-clamp, clamp)
    n = valid.sum(-1, keepdim=True).clamp(min=1.0)
    log_s = (log_r * valid).sum(-1, keepdim=True) / n
    if gradient == "token":  # s_i,t = sg[s_i] * pi_t / sg[pi_t]
        log_s = log_s.detach() + log_r - log_r.detach()
    s = log_s.exp()
    loss = torch.maximum(-adv * s, -adv * s.clamp(1 - eps_low, 1 + eps_high))
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return (weight * valid * loss).sum()


def random_case(seed, per_token):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0  # an empty response
    valid = (torch.arange(T) < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 3
    # per-response drift so that the sequence ratios spread over both clip sides
    logp = old + torch.randn(B, 1, generator=g) * 0.15 + torch.randn(B, T, generator=g) * 0.1
    old[1, 0] -= 30.0  # low enough that the clamped token's log-prob is at most 0
    logp[1, 0] = old[1, 0] + 30.0  # one clamped token
    adv = torch.randn(B, T, generator=g) if per_token else torch.randn(B, 1, generator=g).expand(B, T)
    weight = torch.rand(B, T, generator=g) * 2
    return logp, old, adv.contiguous(), valid, weight


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("per_token", [False, True], ids=["seq-adv", "token-adv"])
@pytest.mark.parametrize("gradient", ["sequence", "token"])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, gradient, per_token, dual_clip):
    logp, old, adv, valid, weight = random_case(seed, per_token)
    eps_low, eps_high = 0.1, 0.12
    # rlstab: token-sum has scale 1, so the weight is exactly the is_weights multiplier
    leaf = logp.clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=leaf, old_logprobs=old, advantages=adv, response_mask=valid.bool(), is_weights=weight)
    surrogate = {"kind": "gspo", "eps_low": eps_low, "eps_high": eps_high, "dual_clip": dual_clip, "gradient": gradient}
    out = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": "token-sum", "count": "valid"}}).compile()(batch)
    out.loss.backward()
    ref_leaf = logp.double().requires_grad_()
    ref = textbook(ref_leaf, old.double(), adv.double(), valid.double(), weight.double(), eps_low, eps_high, dual_clip, gradient)
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-5)
    torch.testing.assert_close(leaf.grad.double(), ref_leaf.grad, rtol=1e-5, atol=1e-6)
    # the case exercises both the clipped and the unclipped branch
    clipped = out.metrics["clip/high_fraction"] + out.metrics["clip/low_fraction"]
    assert 0.0 < clipped < 1.0
    assert ref_leaf.grad[1, 0] == 0.0 and leaf.grad[1, 0] == 0.0  # the clamped token


@pytest.mark.parametrize("seed", range(3))
def test_forms_agree_with_sequence_advantages_and_no_token_weights(seed):
    """The paper's equivalence: per-response advantages, equal weights within a response."""
    logp, old, adv, valid, _ = random_case(seed, per_token=False)
    grads = []
    for gradient in ("sequence", "token"):
        leaf = logp.clone().requires_grad_()
        batch = rlstab.TokenBatch(logprobs=leaf, old_logprobs=old, advantages=adv[:, 0].contiguous(), response_mask=valid.bool())
        surrogate = {"kind": "gspo", "eps_low": 0.1, "eps_high": 0.12, "gradient": gradient}
        objective = rlstab.load({"surrogate": surrogate, "aggregation": {"kind": "seq-mean-token-mean", "count": "valid"}})
        objective.compile()(batch).loss.backward()
        grads.append(leaf.grad)
    # (the clamped token of row 1 gets no gradient in either; its signal, spread over the response's
    # n tokens by the sequence form, gives each other token exactly its own share again)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)
