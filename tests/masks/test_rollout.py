"""Rollout-mismatch masks (IcePop, rejection by k1/k2/k3/binary KL at four levels, the veto), hand-computed."""

import math

import pytest
import torch

import rlstab

LOSS = {"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-sum", "count": "valid"}}


def ratios_batch(ratios, mask=None, adv=None, **extra):
    """On-policy batch whose trainer/inference ratios pi_train(old)/pi_infer are ``ratios`` (pi_infer = 0.01)."""
    r = torch.tensor(ratios, dtype=torch.float64)
    old = (r * 0.01).log().float()
    rollout = torch.full_like(old, math.log(0.01))
    mask = torch.ones(old.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    adv = torch.ones(old.shape[0]) if adv is None else torch.tensor(adv)
    return rlstab.TokenBatch(logprobs=old.clone().requires_grad_(), old_logprobs=old, rollout_logprobs=rollout,
                             response_mask=mask, advantages=adv, **extra)


def keep(mask: dict, batch) -> list:
    """The tokens that train: d loss / d logp = -A for a kept token (surrogate none, r = 1, A = 1, token-sum)."""
    out = rlstab.load({**LOSS, "masks": [mask]}).compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    return (-grad).tolist()


# ---------------------------------------------------------------- IcePop


def test_icepop_keeps_ratios_inside_half_to_five():
    # k = 0.45 < 0.5: out; 0.55, 1, 4.9: in; 5.1 > 5: out
    assert keep({"kind": "icepop"}, ratios_batch([[0.45, 0.55, 1.0, 4.9, 5.1]])) == [[0, 1, 1, 1, 0]]


def test_icepop_masked_tokens_stay_in_the_valid_denominator():
    # 4 valid tokens, ratios 0.45 (out), 1, 1, 6 (out); A = 1, r = 1: l = -1 per kept token.
    b = ratios_batch([[0.45, 1.0, 1.0, 6.0]])
    mean = {"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"}}
    masked = rlstab.load({**mean, "masks": [{"kind": "icepop"}]}).compile()(b)
    assert masked.loss.item() == pytest.approx(-2 / 4)  # IcePop: 1 / sum |y| over all 4 tokens
    assert masked.metrics["tokens/valid"] == 4
    padding = rlstab.load({**mean, "masks": [{"kind": "icepop", "rejected": "padding"}]}).compile()(b)
    assert padding.loss.item() == pytest.approx(-2 / 2)  # rejected tokens leave the denominator
    assert padding.metrics["tokens/valid"] == 2
    # either way the mask reports the 2 tokens it rejected out of the 4 response tokens
    for out in (masked, padding):
        assert (out.metrics["mask/icepop/silenced"], out.metrics["mask/icepop/kept_fraction"]) == (2, 0.5)


def test_icepop_preset_weights_kept_tokens_by_the_ratio():
    # icepop: mask [0.5, 5] and TIS weight min(k, 5); vanilla PPO, token-mean over all valid tokens.
    # ratios 0.45 (out), 2, 4 (in), on-policy r = 1, A = 1: loss = -(2 + 4) / 3
    b = ratios_batch([[0.45, 2.0, 4.0]])
    out = rlstab.load("icepop").compile()(b)
    assert out.loss.item() == pytest.approx(-2.0)


# ---------------------------------------------------------------- rejection: token level


def test_token_k1_band_on_the_ratio():
    # high = 2, low = 1/2 by default: 0.4 out, 0.6 in, 1.9 in, 2.1 out
    b = ratios_batch([[0.4, 0.6, 1.9, 2.1]])
    assert keep({"kind": "rollout_rejection", "divergence": "k1", "high": 2.0}, b) == [[0, 1, 1, 0]]


def test_token_k1_asymmetric_band_bounds_r_not_its_inverse():
    # low 0.8, high 1.5: 0.7 out, 0.9 in, 1.4 in, 1.6 out. (veRL would bound 1/r to [0.8, 1.5], i.e. r to
    # [0.667, 1.25], keeping 0.7 and 0.9 instead: the documented deviation.)
    b = ratios_batch([[0.7, 0.9, 1.4, 1.6]])
    assert keep({"kind": "rollout_rejection", "divergence": "k1", "low": 0.8, "high": 1.5}, b) == [[0, 1, 1, 0]]


def test_token_k2():
    # k2 = 0.5 (log r)^2: r = e^0.5: 0.125; r = e^-0.3: 0.045; r = e^0.4: 0.08. threshold 0.1: out, in, in
    b = ratios_batch([[math.exp(0.5), math.exp(-0.3), math.exp(0.4)]])
    assert keep({"kind": "rollout_rejection", "divergence": "k2", "high": 0.1}, b) == [[0, 1, 1]]


def test_token_k3():
    # k3 = r - 1 - log r: r = 2: 0.3069; r = 0.5: 0.1931; r = 1.2: 0.0177. threshold 0.2: out, in, in
    b = ratios_batch([[2.0, 0.5, 1.2]])
    assert keep({"kind": "rollout_rejection", "divergence": "k3", "high": 0.2}, b) == [[0, 1, 1]]


# ---------------------------------------------------------------- rejection: sequence levels

SEQ = [[1.5, 1.5], [1.5, 0.8], [0.6, 0.7]]


def test_sequence_sum_k1_bounds_the_sequence_ratio():
    # prod r: 2.25 (> 2: out), 1.2 (in), 0.42 (< 0.5: out)
    rule = {"kind": "rollout_rejection", "level": "sequence_sum", "divergence": "k1", "high": 2.0}
    assert keep(rule, ratios_batch(SEQ)) == [[0, 0], [1, 1], [0, 0]]


def test_sequence_mean_k1_bounds_the_geometric_mean_ratio():
    # geometric means: 1.5 (out of [1/1.3, 1.3]), sqrt(1.2) = 1.095 (in), sqrt(0.42) = 0.648 (out)
    rule = {"kind": "rollout_rejection", "level": "sequence_mean", "divergence": "k1", "high": 1.3}
    assert keep(rule, ratios_batch(SEQ)) == [[0, 0], [1, 1], [0, 0]]


def test_sequence_levels_of_k3():
    # per-token k3 = r - 1 - log r: 1.5: 0.0945; 0.8: 0.0231; 0.6: 0.1108; 0.7: 0.0567
    k3 = {r: r - 1 - math.log(r) for r in (1.5, 0.8, 0.6, 0.7)}
    b = ratios_batch(SEQ)
    # sums: 0.1891, 0.1177, 0.1675 -> threshold 0.17 keeps rows 1 and 2
    assert k3[1.5] * 2 > 0.17 > k3[0.6] + k3[0.7] > k3[1.5] + k3[0.8]
    rule = {"kind": "rollout_rejection", "divergence": "k3", "high": 0.17}
    assert keep({**rule, "level": "sequence_sum"}, b) == [[0, 0], [1, 1], [1, 1]]
    # means: 0.0945, 0.0588, 0.0838 -> threshold 0.09 keeps rows 1 and 2
    assert keep({**rule, "level": "sequence_mean", "high": 0.09}, b) == [[0, 0], [1, 1], [1, 1]]
    # max: 0.0945, 0.0945, 0.1108 -> threshold 0.1 keeps rows 0 and 1
    assert keep({**rule, "level": "sequence_max", "high": 0.1}, b) == [[1, 1], [1, 1], [0, 0]]


def test_sequence_max_k2_and_k1():
    # k2 = 0.5 (log r)^2: log 1.5 = 0.405 -> 0.0822; log 0.8 -> 0.0249; log 0.6 -> 0.1305; log 0.7 -> 0.0636
    b = ratios_batch(SEQ)
    rule = {"kind": "rollout_rejection", "level": "sequence_max"}
    assert keep({**rule, "divergence": "k2", "high": 0.1}, b) == [[1, 1], [1, 1], [0, 0]]
    # k1 at sequence_max: every token's r in [1/1.55, 1.55] = [0.645, 1.55]: rows 0 and 1; row 2 has 0.6
    assert keep({**rule, "divergence": "k1", "high": 1.55}, b) == [[1, 1], [1, 1], [0, 0]]


def test_sequence_statistics_ignore_padding_whatever_it_holds():
    # Row 0: tokens 1.5, 0.8 then padding holding a huge ratio and a NaN; prod over the response = 1.2: kept.
    b = ratios_batch([[1.5, 0.8, 1e6, 1.0]], mask=[[True, True, False, False]])
    rollout = b.rollout_logprobs.clone()
    rollout[0, 3] = float("nan")
    b = rlstab.TokenBatch(**{**{f: getattr(b, f) for f in b.__dataclass_fields__}, "rollout_logprobs": rollout})
    for level in ("sequence_sum", "sequence_mean", "sequence_max"):
        rule = {"kind": "rollout_rejection", "level": level, "divergence": "k1", "high": 2.0}
        assert keep(rule, b) == [[1, 1, 0, 0]]


# ---------------------------------------------------------------- veto


def test_veto_rejects_the_whole_response_of_a_catastrophic_token():
    # ratios below 1e-4 veto the response: row 0 has 5e-5; row 1's smallest is 2e-4
    b = ratios_batch([[1.0, 5e-5, 1.0], [2e-4, 1.0, 1.0]])
    assert keep({"kind": "rollout_veto"}, b) == [[0, 0, 0], [1, 1, 1]]
    assert keep({"kind": "rollout_veto", "threshold": 3e-4}, b) == [[0, 0, 0], [0, 0, 0]]


def test_veto_ignores_padding():
    b = ratios_batch([[1.0, 1e-9]], mask=[[True, False]])
    assert keep({"kind": "rollout_veto"}, b) == [[1, 0]]


# ---------------------------------------------------------------- denominators


def test_rejected_tokens_leave_every_denominator():
    # Two responses, A = +1, r = 1, l = -1 per token. Row 0: 3 tokens (ratios 1, 1, 3 -> token k1 [0.5, 2] rejects
    # the third); row 1: 2 tokens, vetoed (ratio 1e-5).
    b = ratios_batch([[1.0, 1.0, 3.0], [1e-5, 1.0, 1.0]], mask=[[True, True, True], [True, True, False]])
    masks = [{"kind": "rollout_rejection", "divergence": "k1", "high": 2.0}, {"kind": "rollout_veto"}]
    for count in ("valid", "kept"):
        # token-mean: 2 trained tokens / 2 remaining tokens (of 5)
        out = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": count},
                           "masks": masks}).compile()(b)
        assert out.loss.item() == pytest.approx(-1.0)
        assert (out.metrics["tokens/valid"], out.metrics["step/tokens_valid"]) == (2, 2)
        # seq-mean-token-mean: row 0 = -2/2, row 1 has no token left and leaves the response count: -1 / 1
        out = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "seq-mean-token-mean", "count": count},
                           "masks": masks}).compile()(b)
        assert out.loss.item() == pytest.approx(-1.0)
    # of the 5 response tokens, k1 rejects row 0's ratio 3 and row 1's ratio 1e-5; the veto rejects row 1's 2 tokens
    assert out.metrics["mask/rollout_rejection/silenced"] == 2
    assert out.metrics["mask/rollout_veto/silenced"] == 2
    # a plain mask of the same tokens (rejected: masked) keeps them in count: valid: -2 / 5
    masked = [dict(m, rejected="masked") for m in masks]
    out = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"},
                       "masks": masked}).compile()(b)
    assert out.loss.item() == pytest.approx(-2 / 5)


def test_rejected_tokens_leave_the_quantile_population():
    # entropy_quantile keeps H >= Q_0.5(H). Entropies 0, 1, 2, 3 on four tokens; the token with entropy 3 is
    # rejected (ratio 10). Population 0, 1, 2: median 1 -> keeps entropies 1 and 2. (With it: median 1.5 -> keeps 2 only.)
    b = ratios_batch([[1.0, 1.0, 1.0, 10.0]], entropy=torch.tensor([[0.0, 1.0, 2.0, 3.0]]))
    masks = [{"kind": "rollout_rejection", "divergence": "k1", "high": 2.0}, {"kind": "entropy_quantile", "rho": 0.5}]
    out = rlstab.load({**LOSS, "masks": masks}).compile()(b)
    assert out.metrics["mask/entropy_quantile/entropy_threshold"] == pytest.approx(1.0)
    assert keep({"kind": "entropy_quantile", "rho": 0.5}, b) == [[0, 0, 1, 1]]  # without rejection: 1.5


def test_micro_batches_equal_the_whole_step_with_rejection():
    from batches import random_batch

    b = random_batch(B=12, T=10, seed=3, advantages="sequence")
    g = torch.Generator().manual_seed(1)
    rollout = (b.old_logprobs + 0.3 * torch.randn(b.old_logprobs.shape, generator=g)).abs().neg()  # at most 0
    fields = {f: getattr(b, f) for f in b.__dataclass_fields__}
    whole = rlstab.TokenBatch(**{**fields, "rollout_logprobs": rollout})
    loss_fn = rlstab.load({"extends": "stapo", "masks": [
        {"kind": "s2t"}, {"kind": "rollout_rejection", "level": "sequence_mean", "divergence": "k3", "high": 0.06}]}).compile()
    full = loss_fn(whole)
    (g_full,) = torch.autograd.grad(full.loss, whole.logprobs)
    assert 0 < full.metrics["mask/rollout_rejection/silenced"] < full.metrics["mask/rollout_rejection/kept"]
    leaf = whole.logprobs.detach().clone().requires_grad_()
    parts = []
    for lo, hi in ((0, 5), (5, 12)):
        f = {k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in {**fields, "rollout_logprobs": rollout}.items()}
        f["logprobs"] = leaf[lo:hi]
        parts.append(rlstab.TokenBatch(**f))
    stats = loss_fn.gather(parts)
    total = sum(loss_fn(p, step=stats).loss for p in parts)
    (g_parts,) = torch.autograd.grad(total, leaf)
    assert total.item() == pytest.approx(full.loss.item(), abs=1e-6)
    torch.testing.assert_close(g_parts, g_full, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "mask, message",
    [
        ({"kind": "rollout_rejection"}, r"masks\[0\]\.high: required field is missing"),
        ({"kind": "rollout_rejection", "divergence": "k2", "high": 0.1, "low": 0.05}, r"low applies to k1 only"),
        ({"kind": "rollout_rejection", "high": 2.0, "low": 3.0}, r"low \(3\.0\) must not exceed high \(2\.0\)"),
        ({"kind": "rollout_rejection", "high": 2.0, "level": "sequence"}, r"masks\[0\]\.level = 'sequence'"),
        ({"kind": "rollout_rejection", "high": -1.0}, r"masks\[0\]\.high = -1\.0"),
        ({"kind": "icepop", "low": 6.0}, r"low \(6\.0\) must not exceed high \(5\.0\)"),
        ({"kind": "icepop", "rejected": "dropped"}, r"masks\[0\]\.rejected = 'dropped'"),
        ({"kind": "rollout_veto", "threshold": 1.0}, r"masks\[0\]\.threshold = 1\.0"),
        ({"kind": "rollout_rejection", "high": 2.0, "binary_kl_floor": 1e-8}, r"binary_kl_floor applies to the binary_kl"),
        ({"kind": "rollout_rejection", "divergence": "binary_kl", "high": 0.1, "binary_kl_floor": 0.5},
         r"masks\[0\]\.binary_kl_floor = 0\.5"),
        ({"kind": "rollout_rejection", "divergence": "binary_kl", "high": 0.1, "low": 0.01}, r"low applies to k1 only"),
    ],
)
def test_bad_fields_are_refused_with_their_path(mask, message):
    with pytest.raises(rlstab.ConfigError, match=message):
        rlstab.load({**LOSS, "masks": [mask]})


def test_needs_rollout_logprobs():
    b = rlstab.TokenBatch(logprobs=torch.zeros(1, 2), response_mask=torch.ones(1, 2, dtype=torch.bool),
                          advantages=torch.ones(1))
    with pytest.raises(rlstab.BatchError, match=r"masks\[0\] \(icepop\) reads TokenBatch\.rollout_logprobs"):
        rlstab.load({**LOSS, "masks": [{"kind": "icepop"}]}).compile()(b)


def test_zero_low_bound_keeps_every_small_ratio():
    """TRL's ``*_mask`` modes with vllm_importance_sampling_clip_min = None: only the upper bound rejects."""
    batch = ratios_batch([[1e-6, 0.01, 1.0, 2.9, 3.1]])
    assert keep({"kind": "icepop", "low": 0.0, "high": 3.0}, batch) == [[1, 1, 1, 1, 0]]
    assert keep({"kind": "rollout_rejection", "low": 0.0, "high": 3.0}, batch) == [[1, 1, 1, 1, 0]]
    # sequence_sum: prod = 1e-6 * 0.01 * 1 * 2.9 * 3.1 ~ 9e-8, inside [0, 3]: the whole response is kept
    seq = {"kind": "rollout_rejection", "level": "sequence_sum", "low": 0.0, "high": 3.0}
    assert keep(seq, batch) == [[1, 1, 1, 1, 1]]
    # rows with products 2.5 (kept) and 3.5 (rejected)
    assert keep(seq, ratios_batch([[2.5, 1.0], [3.5, 1.0]])) == [[1, 1], [0, 0]]


# ---------------------------------------------------------------- binary KL (KPop)


def probabilities_batch(train, infer, mask=None):
    """On-policy batch whose trainer and inference probabilities of the sampled tokens are ``train`` and ``infer``."""
    old = torch.tensor(train, dtype=torch.float64).log().float()
    rollout = torch.tensor(infer, dtype=torch.float64).log().float()
    mask = torch.ones(old.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return rlstab.TokenBatch(logprobs=old.clone().requires_grad_(), old_logprobs=old, rollout_logprobs=rollout,
                             response_mask=mask, advantages=torch.ones(old.shape[0]))


def test_binary_kl_takes_the_larger_direction_and_binary_kl_rollout_one():
    # D_B(a||b) = a ln(a/b) + (1-a) ln((1-a)/(1-b)); p = pi_train(old), q = pi_infer:
    # p = 0.02, q = 0.01: D_B(p||q) = 0.02 ln 2 + 0.98 ln(0.98/0.99) = 0.0138629 - 0.0099494 = 0.0039136
    #                     D_B(q||p) = 0.01 ln 0.5 + 0.99 ln(0.99/0.98) = -0.0069315 + 0.0100509 = 0.0031194
    # p = 0.015, q = 0.01: 0.0010946 and 0.0009580, both below 0.0035
    batch = ratios_batch([[2.0, 1.5, 1.0]])  # q = 0.01, p = 0.01 r
    assert keep({"kind": "rollout_rejection", "divergence": "binary_kl", "high": 0.0035}, batch) == [[0, 1, 1]]
    # OpenRLHF's direction alone, D_B(q||p) = 0.0031194 <= 0.0035: kept
    assert keep({"kind": "rollout_rejection", "divergence": "binary_kl_rollout", "high": 0.0035}, batch) == [[1, 1, 1]]
    assert keep({"kind": "rollout_rejection", "divergence": "binary_kl_rollout", "high": 0.003}, batch) == [[0, 1, 1]]


def test_binary_kl_is_tight_for_confident_tokens_where_the_ratio_is_not():
    # p = 0.95, q = 0.9 (ratio 1.056, inside any usual ratio band):
    #   D_B(p||q) = 0.95 ln(0.95/0.9) + 0.05 ln(0.05/0.1) = 0.0513638 - 0.0346574 = 0.0167065
    #   D_B(q||p) = 0.9 ln(0.9/0.95) + 0.1 ln(0.1/0.05) = -0.0486605 + 0.0693147 = 0.0206542
    # p = 0.0002, q = 0.0001 (ratio 2): D_B(p||q) = 0.0002 ln 2 - 0.9998 ln(0.9999/0.9998) ~ 3.9e-5
    batch = probabilities_batch([[0.95, 0.0002]], [[0.9, 0.0001]])
    assert keep({"kind": "rollout_rejection", "divergence": "binary_kl", "high": 0.02}, batch) == [[0, 1]]
    assert keep({"kind": "rollout_rejection", "divergence": "binary_kl", "high": 0.021}, batch) == [[1, 1]]
    assert keep({"kind": "icepop", "low": 0.5, "high": 1.5}, batch) == [[1, 0]]  # the ratio band: the opposite


def test_binary_kl_floor_keeps_a_certain_token_finite_and_is_an_option():
    # p = 1 (log-prob 0), q = 0.9. Clamped to 1 - 1e-6: D_B(q||p) = 0.9 ln(0.9/(1-1e-6)) + 0.1 ln(0.1/1e-6)
    #   = -0.0948236 + 1.1512925 = 1.0564689, above D_B(p||q) = 0.1053479: kept at 1.2.
    # Clamped to 1 - 1e-8 (AReaL): -0.0948245 + 0.1 ln(0.1/1e-8) = -0.0948245 + 1.6118096 = 1.5169851: rejected.
    # Third token: p = q = 1, D = 0 at either floor (in float32 1 - 1e-8 rounds to 1: the direct formula's 0 log(0/0)
    # would be NaN and reject it).
    batch = probabilities_batch([[1.0, 0.9, 1.0]], [[0.9, 0.9, 1.0]])
    mask = {"kind": "rollout_rejection", "divergence": "binary_kl", "high": 1.2}
    assert keep(mask, batch) == [[1, 1, 1]]
    assert keep({**mask, "binary_kl_floor": 1e-8}, batch) == [[0, 1, 1]]


def test_binary_kl_sequence_mean_and_padding():
    # row 0: tokens with max D_B 0.0039136 (r = 2) and 0.0010946 (r = 1.5): mean 0.0025041
    # row 1: r = 2 only, its second token padding (holding r = 1000, which would dominate)
    batch = ratios_batch([[2.0, 1.5], [2.0, 1000.0]], mask=[[True, True], [True, False]])
    seq = {"kind": "rollout_rejection", "divergence": "binary_kl", "level": "sequence_mean", "high": 0.003}
    assert keep(seq, batch) == [[1, 1], [0, 0]]
    assert keep({**seq, "level": "sequence_max"}, batch) == [[0, 0], [0, 0]]
    assert keep({**seq, "level": "sequence_sum", "high": 0.004}, batch) == [[0, 0], [1, 0]]

