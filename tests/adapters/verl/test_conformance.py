"""rlstab presets against verl 0.9.1's own ``compute_policy_loss_vanilla``, loss and gradients.

The grpo preset is verl's default vanilla loss (clip 0.2/0.2, dual-clip 3); the dapo preset is
vanilla with clip_ratio_high 0.28 and clip_ratio_c 10. Each is run through the registered
``rlstab`` loss under every verl ``agg_loss`` mode, with and without verl's global batch info,
with and without rollout-correction weights, against verl's function on the same inputs.
"""

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from verl_batches import actor_config, random_verl_batch, vanilla_config

PRESETS = {
    "grpo": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0},
    "dapo": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0},
}
MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
GLOBAL_INFO = {
    "local": {},
    # 4 ranks; the step has more tokens and responses than this micro-batch
    "global": {"dp_size": 4, "batch_num_tokens": 183, "global_batch_size": 24, "loss_scale_factor": None},
    "global+scale": {"dp_size": 4, "batch_num_tokens": 183, "global_batch_size": 24, "loss_scale_factor": 37},
}


def run(fn, config, inputs, weights: bool):
    log_prob = inputs["log_prob"].clone().requires_grad_()
    loss, metrics = fn(
        old_log_prob=inputs["old_log_prob"],
        log_prob=log_prob,
        advantages=inputs["advantages"],
        response_mask=inputs["response_mask"],
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=inputs["rollout_is_weights"] if weights else None,
    )
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


@pytest.mark.parametrize("weights", [False, True], ids=["no-is-weights", "is-weights"])
@pytest.mark.parametrize("info", list(GLOBAL_INFO))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_matches_verl_vanilla(preset, mode, info, weights):
    aggregation = {"kind": mode, "count": "valid"}
    ours = actor_config(preset, {"aggregation": aggregation}, loss_agg_mode=mode)
    theirs = vanilla_config(loss_agg_mode=mode, **PRESETS[preset])
    for config in (ours, theirs):
        config.global_batch_info.update(GLOBAL_INFO[info])
    for seed in range(3):
        inputs = random_verl_batch(seed)
        loss, grad, metrics = run(get_policy_loss_fn("rlstab"), ours, inputs, weights)
        ref_loss, ref_grad, ref_metrics = run(get_policy_loss_fn("vanilla"), theirs, inputs, weights)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
        for name, value in ref_metrics.items():
            assert metrics[name] == pytest.approx(value, abs=1e-6), name


def test_the_batch_hits_every_clip_branch():
    """The conformance batch is not trivially inside the clip range."""
    config = actor_config("dapo")
    _, _, metrics = run(get_policy_loss_fn("rlstab"), config, random_verl_batch(0), False)
    assert metrics["actor/rlstab/clip/high_fraction"] > 0
    assert metrics["actor/rlstab/clip/low_fraction"] > 0
    config = actor_config("grpo")
    _, _, metrics = run(get_policy_loss_fn("rlstab"), config, random_verl_batch(0), False)
    assert metrics["actor/pg_clipfrac_lower"] > 0  # ratios above c = 3 with A < 0


def test_kept_count_uses_the_global_valid_count_times_the_micro_batch_kept_share():
    """count: kept in verl: N_kept = batch_num_tokens * (kept / valid in this micro-batch)."""
    # 2 responses of 2 valid tokens, A = +1, r = 1, no clipping: l = -1 per token.
    # low_probability silences the token with p = 0.001 (< 0.002, A > 0): 3 of 4 kept.
    log_prob = torch.log(torch.tensor([[0.5, 0.001], [0.5, 0.5]])).requires_grad_()
    mask = torch.ones(2, 2, dtype=torch.bool)
    config = actor_config(
        "grpo",
        {"masks": [{"kind": "low_probability"}], "surrogate": {"kind": "none"},
         "aggregation": {"kind": "token-mean", "count": "kept"}},
    )
    config.global_batch_info.update({"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 20})
    loss, metrics = get_policy_loss_fn("rlstab")(
        old_log_prob=log_prob.detach(), log_prob=log_prob, advantages=torch.ones(2, 2),
        response_mask=mask, config=config,
    )
    # N_kept = 40 * 3/4 = 30; loss = -3 / 30 * dp_size 2 = -0.2
    assert loss.item() == pytest.approx(-0.2)
    assert metrics["actor/rlstab/step/tokens_kept"] == pytest.approx(30.0)
    assert metrics["actor/rlstab/mask/low_probability/silenced"] == 1.0
