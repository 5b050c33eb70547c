"""The second wave's veRL 0.9.1 policy losses against verl's own functions, loss and gradients within 1e-6.

Each case runs an rlstab preset through the registered ``rlstab`` loss and verl's function on the same
random padded batches (ragged rows, one row with per-token advantages), under every ``agg_loss`` mode
the verl function honours, with and without verl's global batch info and rollout-correction weights:

- ``gpg`` (``compute_policy_loss_gpg``): the ``gpg`` preset (``reinforce``, ``is_weight: none``).
- ``dro`` (``compute_policy_loss_dro``): the ``dro`` preset, ``beta = dro_beta``.
- ``geo_mean`` (``compute_policy_loss_geo_mean``): the ``gmpo`` preset, ``eps_low = clip_ratio_low``,
  ``eps_high = clip_ratio_high``. verl ignores ``loss_agg_mode`` and the global batch info and takes
  ``torch.mean`` over the micro-batch's rows: the same as rlstab's ``seq-mean-token-mean`` for a step
  of one micro-batch without empty rows, which is what is compared (the batches' empty row gets
  tokens). Its ``rollout_is_weights`` become one geometric-mean weight per response; rlstab weighs
  each token: the two agree for per-response weights, which are compared.
- ``bypass_mode`` (``compute_policy_loss_bypass_mode``, ``old_log_prob`` = the rollout's): its
  ``loss_type=reinforce`` is ``reinforce`` with ``is_weight`` = ``rollout_is`` and ``is_cap`` =
  ``rollout_is_threshold``; ``loss_type=ppo_clip`` is the ``grpo`` preset; ``rollout_rs`` is the
  ``bypass_rejection`` mask with ``rollout_rejection``'s options: ``rejected: padding`` when the
  micro-batch is its own step, ``masked`` (its default) under verl's global batch info, which
  counts the step before the bypass rejection.
"""

import pytest
import torch
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import PolicyLossConfig

from verl_batches import actor_config, random_verl_batch, vanilla_config

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
GLOBAL_INFO = {
    "local": {},
    # 4 ranks; the step has more tokens and responses than this micro-batch
    "global": {"dp_size": 4, "batch_num_tokens": 183, "global_batch_size": 24, "loss_scale_factor": None},
    "global+scale": {"dp_size": 4, "batch_num_tokens": 183, "global_batch_size": 24, "loss_scale_factor": 37},
}
GRPO = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}  # the grpo preset = verl vanilla


def run(fn, config, x, mode, weights=None):
    log_prob = x["log_prob"].clone().requires_grad_()
    loss, metrics = fn(
        old_log_prob=x["old_log_prob"], log_prob=log_prob, advantages=x["advantages"],
        response_mask=x["response_mask"], loss_agg_mode=mode, config=config, rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


def configs(preset, overrides, mode, info, policy_loss, **verl_actor):
    ours = actor_config(preset, overrides, loss_agg_mode=mode)
    theirs = vanilla_config(loss_agg_mode=mode, policy_loss=policy_loss, **verl_actor)
    for config in (ours, theirs):
        config.global_batch_info.update(GLOBAL_INFO[info])
    return ours, theirs


def assert_same(x, mode, ours, theirs, verl_loss, weights=None):
    loss, grad, _ = run(get_policy_loss_fn("rlstab"), ours, x, mode, weights)
    ref_loss, ref_grad, ref_metrics = run(get_policy_loss_fn(verl_loss), theirs, x, mode, weights)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    return ref_metrics


# gpg and dro: every agg_loss mode, global info, token-level rollout-correction weights.


@pytest.mark.parametrize("weights", [False, True], ids=["no-is-weights", "is-weights"])
@pytest.mark.parametrize("info", list(GLOBAL_INFO))
@pytest.mark.parametrize("mode", MODES)
def test_gpg_matches_verl(mode, info, weights):
    ours, theirs = configs("gpg", {"aggregation": {"kind": mode, "count": "valid"}}, mode, info,
                           PolicyLossConfig(loss_mode="gpg"))
    for seed in range(3):
        x = random_verl_batch(seed)
        assert_same(x, mode, ours, theirs, "gpg", x["rollout_is_weights"] if weights else None)


@pytest.mark.parametrize("beta", [0.05, 0.7])
@pytest.mark.parametrize("weights", [False, True], ids=["no-is-weights", "is-weights"])
@pytest.mark.parametrize("info", list(GLOBAL_INFO))
@pytest.mark.parametrize("mode", MODES)
def test_dro_matches_verl(mode, info, weights, beta):
    overrides = {"aggregation": {"kind": mode, "count": "valid"}, "surrogate": {"kind": "dro", "beta": beta}}
    ours, theirs = configs("dro", overrides, mode, info, PolicyLossConfig(loss_mode="dro", dro_beta=beta))
    for seed in range(3):
        x = random_verl_batch(seed)
        assert_same(x, mode, ours, theirs, "dro", x["rollout_is_weights"] if weights else None)


# geo_mean: verl's one aggregation, one micro-batch without empty rows, per-response weights.


def without_empty_rows(seed: int) -> dict:
    x = random_verl_batch(seed)
    x["response_mask"][0, :4] = True  # random_verl_batch's row 0 is empty; verl's torch.mean would count it
    return x


@pytest.mark.parametrize("weights", [False, True], ids=["no-is-weights", "per-response-is-weights"])
@pytest.mark.parametrize("bounds", [(0.4, 0.4), (0.2, 0.28)], ids=["preset", "narrow"])
def test_gmpo_matches_verl_geo_mean(bounds, weights):
    low, high = bounds
    overrides = {"surrogate": {"kind": "gmpo", "eps_low": low, "eps_high": high}}
    for mode in MODES:  # verl ignores loss_agg_mode; rlstab keeps the preset's seq-mean-token-mean
        ours, theirs = configs("gmpo", overrides, mode, "local", PolicyLossConfig(loss_mode="geo_mean"),
                               clip_ratio_low=low, clip_ratio_high=high)
        clipped = 0.0
        for seed in range(3):
            x = without_empty_rows(seed)
            w = x["rollout_is_weights"][:, :1].expand_as(x["log_prob"]).contiguous() if weights else None
            metrics = assert_same(x, mode, ours, theirs, "geo_mean", w)
            clipped += metrics["actor/pg_clipfrac"] + metrics["actor/pg_clipfrac_lower"]
        assert clipped > 0  # the clip bites on these batches


def test_gmpo_differs_from_verl_on_token_level_weights():
    """The documented difference: verl folds token weights into their geometric mean per response."""
    ours, theirs = configs("gmpo", {}, "token-mean", "local", PolicyLossConfig(loss_mode="geo_mean"),
                           clip_ratio_low=0.4, clip_ratio_high=0.4)
    x = without_empty_rows(0)
    loss, _, _ = run(get_policy_loss_fn("rlstab"), ours, x, "token-mean", x["rollout_is_weights"])
    ref, _, _ = run(get_policy_loss_fn("geo_mean"), theirs, x, "token-mean", x["rollout_is_weights"])
    assert abs(loss.item() - ref.item()) > 1e-3


# bypass_mode: old_log_prob is the rollout's; the current policy differs from it by N(0, 0.3^2).


def bypass_inputs(seed: int, noise: float = 0.3) -> dict:
    x = random_verl_batch(seed)
    g = torch.Generator().manual_seed(2000 + seed)
    x["log_prob"] = x["old_log_prob"] + noise * torch.randn(x["old_log_prob"].shape, generator=g)
    return x


CAP = 1.2  # rollout_is_threshold: truncates some token and some sequence weights of these batches, not all

# verl's rollout_rs option -> (threshold, rlstab's rollout_rejection options); thresholds that reject some, not all
RS = {
    None: (None, None),
    "token_k1": (1.3, {"level": "token", "divergence": "k1", "high": 1.3}),
    "token_k3": (0.03, {"level": "token", "divergence": "k3", "high": 0.03}),
    "seq_sum_k1": ("0.5_2.0", {"level": "sequence_sum", "divergence": "k1", "low": 0.5, "high": 2.0}),
    "seq_mean_k3": (0.04, {"level": "sequence_mean", "divergence": "k3", "high": 0.04}),
    "seq_max_k2": (0.12, {"level": "sequence_max", "divergence": "k2", "high": 0.12}),
}


def bypass_configs(mode, info, loss_type, rollout_is, rs, rejected):
    threshold, mask = RS[rs]
    correction = RolloutCorrectionConfig(rollout_is=rollout_is, rollout_is_threshold=CAP, rollout_rs=rs,
                                         rollout_rs_threshold=threshold, bypass_mode=True, loss_type=loss_type)
    overrides = {"aggregation": {"kind": mode, "count": "valid"},
                 "masks": [] if mask is None else [{"kind": "bypass_rejection", **mask, "rejected": rejected}]}
    if loss_type == "reinforce":
        overrides["surrogate"] = {"kind": "reinforce", "is_weight": rollout_is or "none", "is_cap": CAP}
    return configs("grpo", overrides, mode, info, PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=correction),
                   **GRPO)


@pytest.mark.parametrize("rs", list(RS))
@pytest.mark.parametrize("rollout_is", ["token", "sequence", None])
@pytest.mark.parametrize("mode", MODES)
def test_bypass_reinforce_matches_verl(mode, rollout_is, rs):
    ours, theirs = bypass_configs(mode, "local", "reinforce", rollout_is, rs, "padding")
    masked = []
    for seed in range(3):
        metrics = assert_same(bypass_inputs(seed), mode, ours, theirs, "bypass_mode")
        masked.append(metrics.get("rollout_corr/rollout_rs_masked_fraction", 0.5))
    assert 0 < max(masked) and min(masked) < 1  # the rejection bites without rejecting everything


@pytest.mark.parametrize("rs", list(RS))
@pytest.mark.parametrize("mode", MODES)
def test_bypass_ppo_clip_matches_verl(mode, rs):
    ours, theirs = bypass_configs(mode, "local", "ppo_clip", "token", rs, "padding")  # verl computes IS weights, applies none
    for seed in range(3):
        assert_same(bypass_inputs(seed), mode, ours, theirs, "bypass_mode")


def _mixed_counts(mode, rs):
    """verl's ``seq-mean-token-mean`` under a token-level rejection with global batch info: see below."""
    return mode == "seq-mean-token-mean" and rs is not None and rs.startswith("token")


GLOBAL_BYPASS = [(mode, info, rs) for mode in MODES for info in ("global", "global+scale") for rs in RS
                 if not _mixed_counts(mode, rs)]
MIXED_BYPASS = [(info, rs) for info in ("global", "global+scale") for rs in RS if _mixed_counts("seq-mean-token-mean", rs)]


@pytest.mark.parametrize(("mode", "info", "rs"), GLOBAL_BYPASS)
def test_bypass_with_global_batch_info_matches_verl(mode, info, rs):
    """verl's global denominators count the response mask before its bypass rejection: ``rejected: masked``
    (``seq-mean-token-mean`` under a token-level rejection is the exception, the next test)."""
    for loss_type in ("reinforce", "ppo_clip"):
        ours, theirs = bypass_configs(mode, info, loss_type, "sequence", rs, rejected="masked")
        for seed in range(3):
            assert_same(bypass_inputs(seed), mode, ours, theirs, "bypass_mode")


@pytest.mark.parametrize(("info", "rs"), MIXED_BYPASS)
def test_bypass_seq_mean_token_mean_with_token_rejection_is_neither_rlstab_count(info, rs):
    """Here verl divides each response's sum by its tokens left after the rejection (a ``padding`` count) and
    the step by every response (a ``masked`` count): no single ``rejected`` option is both, and neither equals it."""
    mode = "seq-mean-token-mean"
    for rejected in ("masked", "padding"):
        ours, theirs = bypass_configs(mode, info, "reinforce", "sequence", rs, rejected=rejected)
        with pytest.raises(AssertionError):
            for seed in range(3):
                assert_same(bypass_inputs(seed), mode, ours, theirs, "bypass_mode")


@pytest.mark.parametrize("info", list(GLOBAL_INFO))
@pytest.mark.parametrize("mode", MODES)
def test_bypass_icepop_matches_verl(mode, info):
    """verl's IcePop threshold in bypass mode ('0.7_1.4': weights outside the band zeroed, the response mask
    untouched) is a token k1 ``bypass_rejection`` band with ``rejected: masked`` and ``is_cap`` its upper bound."""
    correction = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.7_1.4", bypass_mode=True,
                                         loss_type="reinforce")
    overrides = {"aggregation": {"kind": mode, "count": "valid"},
                 "surrogate": {"kind": "reinforce", "is_weight": "token", "is_cap": 1.4},
                 "masks": [{"kind": "bypass_rejection", "level": "token", "divergence": "k1", "low": 0.7, "high": 1.4,
                            "rejected": "masked"}]}
    ours, theirs = configs("grpo", overrides, mode, info,
                           PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=correction), **GRPO)
    out_of_band = 0.0
    for seed in range(3):
        metrics = assert_same(bypass_inputs(seed), mode, ours, theirs, "bypass_mode")
        out_of_band += metrics["rollout_corr/rollout_is_oob_ratio"]
    assert 0 < out_of_band < 3


def test_bypass_weights_bite():
    """The cap truncates some token and some sequence weights and not others (so the truncation is compared)."""
    token, sequence = [], []
    for seed in range(3):
        x = bypass_inputs(seed)
        log_ratio = torch.where(x["response_mask"], x["log_prob"] - x["old_log_prob"], 0.0)
        token.append(log_ratio.exp()[x["response_mask"]])
        sequence.append(log_ratio.sum(-1).exp())
    for ratios in (torch.cat(token), torch.cat(sequence)):
        assert (ratios > CAP).any() and (ratios < CAP).any()
