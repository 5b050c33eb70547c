"""The catalogue's presets against verl 0.9.1's own policy losses, loss and gradients within 1e-6.

Each case runs an rlstab preset (optionally with overrides) through the registered ``rlstab`` loss
and verl's function of the same method on the same inputs, under the verl config values that
function reads, under every ``agg_loss`` mode (the rlstab objective's aggregation set to the
same mode), with and without verl's global batch info, with and without rollout-correction
weights. Presets are compared under their own values too, and under other values to show the
mapping between rlstab's fields and verl's.

- sapo: verl aggregates ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says, so the rlstab
  side keeps the preset's ``seq-mean-token-mean`` for every mode.
- cispo: ``max_weight = 1 + clip_ratio_high``, ``min_weight = 1 - clip_ratio_low``.
- dppo_tv / dppo_kl: ``delta_* = clip_ratio_*``; ``is_cap = clip_ratio_c`` (null ~ the authors'
  10000; an ``ActorConfig`` defaults to 3).
- clip_cov: the draw is controlled: ``torch.manual_seed(s)`` before verl's function and
  ``seed: s`` in rlstab pick the same tokens (also with ``seed: null`` and the same global seed).
- kl_cov: ``fraction = kl_cov_ratio``, ``coef = ppo_kl_coef``.
- gspo: verl's loss is GSPO-token, rlstab's ``gradient: token``.
"""

import pytest
import torch
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


def case(preset, verl_loss, verl_actor=None, verl_policy_loss=None, surrogate=None, metrics=(), fixed_aggregation=None):
    return {
        "preset": preset,
        "verl_loss": verl_loss,
        "verl_actor": verl_actor or {},
        "verl_policy_loss": verl_policy_loss or {},
        "surrogate": surrogate or {},
        "metrics": metrics,
        "fixed_aggregation": fixed_aggregation,
    }


SAPO_AGG = {"kind": "seq-mean-token-mean", "count": "valid"}
CASES = {
    "sapo": case("sapo", "sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, metrics=("actor/ppo_kl", "actor/pg_clipfrac"),
                 fixed_aggregation=SAPO_AGG),
    "sapo-taus": case("sapo", "sapo", {"tau_pos": 0.5, "tau_neg": 2.0}, surrogate={"tau_pos": 0.5, "tau_neg": 2.0},
                      fixed_aggregation=SAPO_AGG),
    "cispo": case("cispo", "cispo", {"clip_ratio_low": 1.0, "clip_ratio_high": 4.0},
                  metrics=("actor/ppo_kl", "actor/pg_clipfrac")),
    "cispo-two-sided": case("cispo", "cispo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
                            surrogate={"min_weight": 0.8, "max_weight": 1.28}, metrics=("actor/pg_clipfrac",)),
    "dppo_tv": case("dppo_tv", "dppo_tv", {"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 10000.0},
                    metrics=("actor/ppo_kl", "actor/pg_clipfrac")),
    "dppo_tv-cap": case("dppo_tv", "dppo_tv", {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 3.0},
                        surrogate={"delta_low": 0.1, "delta_high": 0.3, "is_cap": 3.0}, metrics=("actor/pg_clipfrac",)),
    "dppo_kl": case("dppo_kl", "dppo_kl", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 10000.0},
                    metrics=("actor/ppo_kl", "actor/pg_clipfrac")),
    "dppo_kl-cap": case("dppo_kl", "dppo_kl", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.02, "clip_ratio_c": 3.0},
                        surrogate={"delta_low": 0.2, "delta_high": 0.02, "is_cap": 3.0}, metrics=("actor/pg_clipfrac",)),
    "clip_cov": case("clip_cov", "clip_cov", {"clip_ratio_low": 1.0, "clip_ratio_high": 1.0},
                     {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}),
    "clip_cov-many": case("clip_cov", "clip_cov", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
                          {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.0, "clip_cov_ub": 5.0},
                          surrogate={"eps_low": 0.2, "eps_high": 0.28, "fraction": 0.1, "cov_low": 0.0,
                                     "cov_high": 5.0, "seed": 5}),
    "kl_cov": case("kl_cov", "kl_cov", {}, {"kl_cov_ratio": 0.002, "ppo_kl_coef": 1.0}),
    "kl_cov-many": case("kl_cov", "kl_cov", {}, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.3},
                        surrogate={"fraction": 0.2, "coef": 0.3}),
    "gspo": case("gspo", "gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, surrogate={"gradient": "token"},
                 metrics=("actor/ppo_kl", "actor/pg_clipfrac")),
    "gspo-wide": case("gspo", "gspo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
                      surrogate={"gradient": "token", "eps_low": 0.2, "eps_high": 0.28}, metrics=("actor/pg_clipfrac",)),
}


def probability_batch(seed: int) -> dict[str, torch.Tensor]:
    """``random_verl_batch`` with log-probabilities of real probabilities (<= 0), as DPPO's trust regions need."""
    inputs = random_verl_batch(seed)
    inputs["log_prob"] = inputs["log_prob"].clamp(max=-1e-3)
    return inputs


def run(fn, config, inputs, weights: bool, seed: int):
    log_prob = inputs["log_prob"].clone().requires_grad_()
    torch.manual_seed(seed)  # Clip-Cov's draw from the global generator (verl; rlstab with seed: null)
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


def configs(c: dict, mode: str, info: str):
    aggregation = c["fixed_aggregation"] or {"kind": mode, "count": "valid"}
    overrides = {"aggregation": aggregation}
    if c["surrogate"]:
        overrides["surrogate"] = c["surrogate"]
    ours = actor_config(c["preset"], overrides, loss_agg_mode=mode)
    policy_loss = PolicyLossConfig(loss_mode=c["verl_loss"], **c["verl_policy_loss"])
    theirs = vanilla_config(loss_agg_mode=mode, policy_loss=policy_loss, **c["verl_actor"])
    for config in (ours, theirs):
        config.global_batch_info.update(GLOBAL_INFO[info])
    return ours, theirs


def compare(c, ours, theirs, seed, weights):
    inputs = probability_batch(seed)
    # verl's Clip-Cov draws from the global generator: seed it as rlstab's clip_cov seed says (when set)
    own_seed = getattr(ours.policy_loss.rlstab_objective.surrogate, "seed", None)
    global_seed = seed if own_seed is None else own_seed
    loss, grad, metrics = run(get_policy_loss_fn("rlstab"), ours, inputs, weights, global_seed)
    ref_loss, ref_grad, ref_metrics = run(get_policy_loss_fn(c["verl_loss"]), theirs, inputs, weights, global_seed)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    for name in c["metrics"]:
        assert metrics[name] == pytest.approx(ref_metrics[name], abs=1e-6), name
    return metrics, ref_metrics


@pytest.mark.parametrize("weights", [False, True], ids=["no-is-weights", "is-weights"])
@pytest.mark.parametrize("info", list(GLOBAL_INFO))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_preset_matches_verl(name, mode, info, weights):
    c = CASES[name]
    ours, theirs = configs(c, mode, info)
    for seed in range(3):
        metrics, ref_metrics = compare(c, ours, theirs, seed, weights)
        if c["verl_loss"] == "clip_cov":  # the same number of tokens detached (verl: pg_clipfrac = share with corr 0)
            assert metrics["actor/rlstab/clip/cov_fraction"] == pytest.approx(ref_metrics["actor/pg_clipfrac"], abs=1e-6)


def test_clip_cov_with_the_global_generator_matches_verl():
    """seed: null draws from torch's global generator, exactly as verl: the same global seed, the same draw."""
    c = dict(CASES["clip_cov-many"])
    c["surrogate"] = {**c["surrogate"], "seed": None}
    ours, theirs = configs(c, "token-mean", "local")
    assert ours.policy_loss.rlstab_objective.surrogate.seed is None
    for seed in range(5):
        compare(c, ours, theirs, seed, weights=False)


def test_the_batches_exercise_each_method():
    """The conformance cases are not trivial: clips, masks, draws and penalties happen on these batches."""

    def metrics_of(name, which, key):  # summed over the three conformance batches
        c = CASES[name]
        ours, theirs = configs(c, "token-mean", "local")
        return sum(compare(c, ours, theirs, seed, weights=False)[which][key] for seed in range(3))

    assert metrics_of("cispo", 1, "actor/pg_clipfrac") > 0  # some ratios above 5
    assert metrics_of("dppo_tv", 1, "actor/pg_clipfrac") > 0  # some tokens leave the TV region
    assert metrics_of("dppo_kl", 1, "actor/pg_clipfrac") > 0
    assert metrics_of("dppo_tv-cap", 0, "actor/rlstab/clip/truncated_fraction") > 0
    # Clip-Cov draws one token (of 2, 1 and 10 candidates) per batch for the preset, and 3, 2 and 3 tokens
    # (of 8, 10 and 4 candidates) for clip_cov-many: the draw is a real choice on two batches of each.
    assert metrics_of("clip_cov", 1, "actor/pg_clipfrac") == pytest.approx(1 / 34 + 1 / 26 + 1 / 38)
    assert metrics_of("clip_cov-many", 1, "actor/pg_clipfrac") == pytest.approx(3 / 34 + 2 / 26 + 3 / 38)
    assert metrics_of("kl_cov-many", 0, "actor/rlstab/kl_cov/penalised_fraction") > 0.15 * 3
    gspo = metrics_of("gspo-wide", 1, "actor/pg_clipfrac")
    assert 0 < gspo < 3  # some responses clipped, some not
    assert metrics_of("sapo", 0, "actor/rlstab/sapo/gradient_weight_mean") < 0.99 * 3  # the gate attenuates


def test_the_seeded_draw_differs_between_seeds():
    """The draw really depends on the seed (so matching verl under equal seeds is not a coincidence)."""
    c = CASES["clip_cov-many"]
    grads = []
    for seed in (5, 6):
        c2 = {**c, "surrogate": {**c["surrogate"], "seed": seed}}
        ours, _ = configs(c2, "token-mean", "local")
        grads.append(run(get_policy_loss_fn("rlstab"), ours, probability_batch(0), False, 0)[1])
    assert not torch.equal(grads[0], grads[1])
