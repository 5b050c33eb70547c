"""AReaL's decoupled PPO (the ``decoupled_ppo`` reweighter) against verl 0.9.1's own "decoupled mode", 1e-6.

verl's rollout correction in decoupled mode (three policies: rollout = behaviour, old = proximal,
current) with a token-level IcePop band ``rollout_is_threshold: "<lower>_<upper>"`` zeroes the
importance weight pi_old / pi_rollout outside the band and leaves ``response_mask`` untouched
(``verl/trainer/ppo/rollout_corr_helper.py`` ``compute_rollout_correction_weights``). With the lower
bound near 0 (verl requires it positive) that is AReaL's ``behav_imp_weight_cap``: the cap drops
tokens above it, which still count in the denominator. Compared under every ``agg_loss`` mode, loss
and gradients, on random batches with padding, an empty row and uneven lengths; verl's vanilla loss
always dual-clips (``clip_ratio_c``), so the preset is compared with the same dual-clip.
"""

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

import rlstab

from verl_batches import random_verl_batch, vanilla_config

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
CAP = 5.0


def inputs(seed: int) -> dict:
    """verl-shaped inputs with a stale behaviour policy: log pi_old - log pi_rollout ~ N(0, 1.5^2)."""
    x = random_verl_batch(seed)
    g = torch.Generator().manual_seed(2000 + seed)
    x["rollout_log_prob"] = x["old_log_prob"] + 1.5 * torch.randn(x["old_log_prob"].shape, generator=g)
    return x


def verl_side(x, mode, dual_clip):
    proto, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=x["old_log_prob"], rollout_log_prob=x["rollout_log_prob"], response_mask=x["response_mask"],
        rollout_is="token", rollout_is_threshold=f"1e-12_{CAP}", rollout_rs=None,
    )
    log_prob = x["log_prob"].clone().requires_grad_()
    config = vanilla_config(loss_agg_mode=mode, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=dual_clip)
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob=x["old_log_prob"], log_prob=log_prob, advantages=x["advantages"], response_mask=mask.bool(),
        loss_agg_mode=mode, config=config, rollout_is_weights=proto.batch["rollout_is_weights"],
    )
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


def rlstab_side(x, mode, dual_clip):
    objective = rlstab.load({
        "extends": "decoupled_ppo",
        "surrogate": {"dual_clip": dual_clip},
        "aggregation": {"kind": mode, "count": "valid"},
    })
    log_prob = x["log_prob"].clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=log_prob, old_logprobs=x["old_log_prob"], advantages=x["advantages"],
                              response_mask=x["response_mask"], rollout_logprobs=x["rollout_log_prob"])
    out = objective.compile()(batch)
    out.loss.backward()
    return out.loss.detach(), log_prob.grad, out


@pytest.mark.parametrize("dual_clip", [3.0, 1e6])
@pytest.mark.parametrize("mode", MODES)
def test_decoupled_ppo_matches_verl_decoupled_mode(mode, dual_clip):
    for seed in range(3):
        x = inputs(seed)
        loss, grad, metrics = verl_side(x, mode, dual_clip)
        ours, our_grad, out = rlstab_side(x, mode, dual_clip)
        torch.testing.assert_close(ours, loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(our_grad, grad, rtol=1e-6, atol=1e-6)
        dropped = metrics["rollout_corr/rollout_is_oob_ratio"]
        assert 0 < dropped < 1  # the cap drops some tokens, not all
        assert out.metrics["reweight/decoupled_ppo/capped_fraction"] == pytest.approx(dropped, abs=1e-6)


def test_the_adapter_refuses_it_without_the_behaviour_policy():
    """verl's loss is not given rollout log-probabilities: the config names the component and verl's own route."""
    from rlstab.adapters.verl.config import build_objective
    from rlstab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"reweighters\[0\] \(decoupled_ppo\) reads TokenBatch\.rollout_logprobs: "
                                          r"veRL applies its rollout correction in the driver"):
        build_objective("decoupled_ppo", {})
