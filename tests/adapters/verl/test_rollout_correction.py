"""Rollout-mismatch corrections against verl 0.9.1's own rollout correction, loss and gradients within 1e-6.

verl computes its rollout correction in ``verl/trainer/ppo/rollout_corr_helper.py``
(``compute_rollout_correction_and_rejection_mask``): rejection sampling (``rollout_rs``) edits
``response_mask``, importance weights (``rollout_is``: TIS, or IcePop with a ``lower_upper``
threshold) become ``rollout_is_weights``; its vanilla policy loss then runs on both. rlstab runs the
same method as masks and reweighters reading ``rollout_logprobs``. Compared: every ``rollout_rs``
option verl has (``token_k1..3``, ``seq_sum_k1..3``, ``seq_mean_k1..3``, ``seq_max_k2/3``), token and
sequence TIS, IcePop, and the K3-RS + token-TIS combination of the ``recipe-2026`` preset, under
every ``agg_loss`` mode.
"""

import math

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

import rlstab
from rlstab.tokens import Tokens

from verl_batches import random_verl_batch, vanilla_config

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
GRPO = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}  # the grpo preset = verl vanilla

# verl option -> (its threshold, rlstab's mask). k1 thresholds are symmetric bands (low = 1/high), where verl's
# test of -log r and rlstab's of log r agree; the thresholds reject some responses or tokens but not all.
RS = {
    "token_k1": (1.5, {"level": "token", "divergence": "k1", "high": 1.5}),
    "token_k2": (0.03, {"level": "token", "divergence": "k2", "high": 0.03}),
    "token_k3": (0.03, {"level": "token", "divergence": "k3", "high": 0.03}),
    "seq_sum_k1": ("0.5_2.0", {"level": "sequence_sum", "divergence": "k1", "low": 0.5, "high": 2.0}),
    "seq_sum_k2": (0.25, {"level": "sequence_sum", "divergence": "k2", "high": 0.25}),
    "seq_sum_k3": (0.25, {"level": "sequence_sum", "divergence": "k3", "high": 0.25}),
    "seq_mean_k1": (1.15, {"level": "sequence_mean", "divergence": "k1", "high": 1.15}),
    "seq_mean_k2": (0.04, {"level": "sequence_mean", "divergence": "k2", "high": 0.04}),
    "seq_mean_k3": (0.04, {"level": "sequence_mean", "divergence": "k3", "high": 0.04}),
    "seq_max_k2": (0.12, {"level": "sequence_max", "divergence": "k2", "high": 0.12}),
    "seq_max_k3": (0.12, {"level": "sequence_max", "divergence": "k3", "high": 0.12}),
}


def inputs(seed: int, noise: float = 0.25) -> dict:
    """verl-shaped inputs with an inference engine whose log-probs differ from the trainer's by N(0, noise^2)."""
    batch = random_verl_batch(seed)
    g = torch.Generator().manual_seed(1000 + seed)
    batch["rollout_log_prob"] = batch["old_log_prob"] + noise * torch.randn(batch["old_log_prob"].shape, generator=g)
    return batch


def verl_side(x, mode, rollout_is=None, is_threshold=2.0, rs=None, rs_threshold=None):
    proto, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=x["old_log_prob"], rollout_log_prob=x["rollout_log_prob"], response_mask=x["response_mask"],
        rollout_is=rollout_is, rollout_is_threshold=is_threshold, rollout_rs=rs, rollout_rs_threshold=rs_threshold,
    )
    weights = None if proto is None else proto.batch["rollout_is_weights"]
    log_prob = x["log_prob"].clone().requires_grad_()
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=x["old_log_prob"], log_prob=log_prob, advantages=x["advantages"], response_mask=mask.bool(),
        loss_agg_mode=mode, config=vanilla_config(loss_agg_mode=mode, **GRPO), rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), log_prob.grad, mask.bool(), metrics


def rlstab_side(x, mode, masks=(), reweighters=()):
    objective = rlstab.load({"extends": "grpo", "masks": list(masks), "reweighters": list(reweighters),
                             "aggregation": {"kind": mode, "count": "valid"}})
    log_prob = x["log_prob"].clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=log_prob, old_logprobs=x["old_log_prob"], advantages=x["advantages"],
                              response_mask=x["response_mask"], rollout_logprobs=x["rollout_log_prob"])
    out = objective.compile()(batch)
    out.loss.backward()
    return out.loss.detach(), log_prob.grad, batch, objective


def assert_same(ours, theirs):
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("option", list(RS))
def test_rejection_matches_verl_rollout_rs(option, mode):
    threshold, mask = RS[option]
    mask = {"kind": "rollout_rejection", **mask}
    fractions = []
    for seed in range(3):
        x = inputs(seed)
        theirs = verl_side(x, mode, rs=option, rs_threshold=threshold)
        ours = rlstab_side(x, mode, masks=[mask])
        assert_same(ours, theirs)
        # the kept tokens themselves
        objective, batch = ours[3], ours[2]
        keep = objective.masks[0].keep(Tokens.from_batch(batch, 20.0), None) > 0
        assert torch.equal(keep & x["response_mask"], theirs[2])
        fractions.append(theirs[3]["rollout_corr/rollout_rs_masked_fraction"])
    assert 0 < max(fractions) and min(fractions) < 1  # the thresholds bite without rejecting everything


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_matches_verl_rollout_is(level, mode):
    for seed in range(3):
        x = inputs(seed)
        theirs = verl_side(x, mode, rollout_is=level, is_threshold=2.0)
        ours = rlstab_side(x, mode, reweighters=[{"kind": "tis", "level": level, "cap": 2.0}])
        assert_same(ours, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_icepop_matches_verl_icepop(mode):
    """verl's IcePop: rollout_is_threshold '0.5_5.0' zeroes the weights outside the band, response_mask untouched."""
    for seed in range(3):
        x = inputs(seed)
        x["rollout_log_prob"] = (x["old_log_prob"] + 1.2 * torch.randn(x["old_log_prob"].shape,
                                                                       generator=torch.Generator().manual_seed(seed))).abs().neg()
        theirs = verl_side(x, mode, rollout_is="token", is_threshold="0.5_5.0")
        preset = rlstab.load("icepop")
        ours = rlstab_side(x, mode, masks=[m.model_dump() for m in preset.masks],
                           reweighters=[w.model_dump() for w in preset.reweighters])
        assert_same(ours, theirs)
        assert 0 < theirs[3]["rollout_corr/rollout_is_oob_ratio"] < 1


@pytest.mark.parametrize("mode", MODES)
def test_k3_rejection_with_token_tis_matches_verl(mode):
    """The recipe-2026 correction: verl's decoupled_k3_rs_token_tis (token TIS 2 + seq_mean_k3 rejection)."""
    recipe = rlstab.load("recipe-2026")
    (tis,) = recipe.reweighters
    rejection = recipe.masks[1].model_dump()
    for seed in range(3):
        x = inputs(seed, noise=0.14)  # mean k3 ~ noise^2 / 2 ~ 0.01: some responses pass, some do not
        theirs = verl_side(x, mode, rollout_is="token", is_threshold=tis.cap, rs="seq_mean_k3",
                           rs_threshold=rejection["high"])
        ours = rlstab_side(x, mode, masks=[rejection], reweighters=[tis.model_dump()])
        assert_same(ours, theirs)
        assert 0 < theirs[3]["rollout_corr/rollout_rs_seq_masked_fraction"] < 1


def preset_side(x, mode, name):
    preset = rlstab.load(name)
    return rlstab_side(x, mode, masks=[m.model_dump() for m in preset.masks],
                       reweighters=[w.model_dump() for w in preset.reweighters])


@pytest.mark.parametrize("mode", MODES)
def test_seq_tis_preset_matches_verl_decoupled_seq_is(mode):
    """seq_tis: verl's RolloutCorrectionConfig.decoupled_seq_is() (rollout_is sequence, threshold 2.0)."""
    truncated = []
    for seed in range(3):
        x = inputs(seed, noise=0.3)
        theirs = verl_side(x, mode, rollout_is="sequence", is_threshold=2.0)
        assert_same(preset_side(x, mode, "seq_tis"), theirs)
        log_ratio = ((x["old_log_prob"] - x["rollout_log_prob"]) * x["response_mask"]).sum(-1)
        truncated += (log_ratio.exp() > 2.0).tolist()
    assert 0 < sum(truncated) < len(truncated)  # the cap binds on some responses, not on all


@pytest.mark.parametrize("mode", MODES)
def test_seq_mis_preset_matches_verl_geo_rejection_with_the_untruncated_sequence_weight(mode):
    """seq_mis: verl's seq_mean_k1 rejection in [0.999, 1.001] (decoupled_geo_rs) and rollout_is sequence.

    verl truncates every IS weight; a threshold above every sequence ratio of these batches is the
    untruncated weight seq_mis takes. verl tests the geometric mean of 1/r against the band, rlstab of r:
    for [0.999, 1.001] they differ only for a mean log-ratio in (log 0.999, -log 1.001), asserted empty here.
    """
    rejected = []
    for seed in range(3):
        x = inputs(seed, noise=0.002)  # geometric means within a few 1e-3 of 1: the band keeps some, rejects some
        log_ratio = ((x["old_log_prob"] - x["rollout_log_prob"]) * x["response_mask"]).sum(-1)
        assert log_ratio.exp().max() < 1e3
        mean = log_ratio / x["response_mask"].sum(-1).clamp(min=1)
        assert not ((mean > math.log(0.999)) & (mean < -math.log(1.001))).any()
        theirs = verl_side(x, mode, rollout_is="sequence", is_threshold=1e3, rs="seq_mean_k1", rs_threshold="0.999_1.001")
        assert_same(preset_side(x, mode, "seq_mis"), theirs)
        rejected.append(theirs[3]["rollout_corr/rollout_rs_masked_fraction"])
    assert 0 < max(rejected) and min(rejected) < 1
