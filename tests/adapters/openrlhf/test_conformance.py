"""RlstabPolicyLoss against OpenRLHF 0.11.2's own PolicyLoss: loss, gradients and the other tuple members.

Each case pairs an rlstab objective with the OpenRLHF arguments that compute the same method,
runs both on the same random micro-batches under OpenRLHF's global-count variants (unset,
set, dp_size > 1) and importance-sampling corrections, and compares all five returned values.
"""

import pytest
import torch

import rlstab
from rlstab.adapters.openrlhf import RlstabPolicyLoss

from openrlhf_batches import openrlhf_policy_loss, random_micro_batch

METHODS = {
    # name: (rlstab surrogate, OpenRLHF PolicyLoss arguments, log-ratio spread of the batch)
    "ppo": ({"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28}, {"clip_eps_low": 0.2, "clip_eps_high": 0.28}, 2.0),
    "dual-clip": (
        {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0},
        {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "dual_clip": 3.0},
        2.0,
    ),
    # GSPO: a clip range wide enough, and ratios close enough to 1, that some responses stay unclipped
    "gspo": (
        {"kind": "gspo", "eps_low": 0.1, "eps_high": 0.12},
        {"clip_eps_low": 0.1, "clip_eps_high": 0.12, "policy_loss_type": "gspo"},
        0.4,
    ),
}
AGGREGATIONS = {True: "token-mean", False: "seq-mean-token-mean"}
COUNTS = {
    "unset": {},
    "dp-only": {"dp_size": 4},  # OpenRLHF then takes the micro-batch's own mean, without dp_size
    "global": {"dp_size": 4, "batch_num_tokens": 183.0, "global_batch_size": 24.0},
    "global-tensors": {"dp_size": 2, "batch_num_tokens": torch.tensor(61.5), "global_batch_size": torch.tensor(9.0)},
    "tokens-only": {"dp_size": 2, "batch_num_tokens": 70.0},
    "sequences-only": {"dp_size": 2, "global_batch_size": 12.0},
}
CORRECTIONS = {
    "off": {},
    "token-mask-ratio": {"is_correction_level": "token", "is_correction_mode": "mask", "is_correction_threshold": [0.5, 2.0]},
    "token-clip-ratio": {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": [0.7, 1.5]},
    "seq-mask-ratio": {"is_correction_level": "seq", "is_correction_mode": "mask", "is_correction_threshold": [0.8, 1.25]},
    "token-mask-tv": {"is_correction_level": "token", "is_correction_gating": "tv", "is_correction_threshold": [0.0, 0.02]},
    "seq-mask-binary-kl": {
        "is_correction_level": "seq", "is_correction_gating": "binary_kl", "is_correction_threshold": [0.0, 0.03]},
}


def run(loss_fn, inputs, counts):
    log_probs = inputs["log_probs"].clone().requires_grad_()
    out = loss_fn(
        log_probs,
        inputs["old_log_probs"],
        inputs["advantages"],
        action_mask=inputs["action_mask"],
        rollout_log_probs=inputs["rollout_log_probs"],
        **counts,
    )
    out[0].backward()
    return out, log_probs.grad


def pair(method, token_level, correction):
    surrogate, theirs, spread = METHODS[method]
    kwargs = {**theirs, **CORRECTIONS[correction]}
    if method != "gspo":
        kwargs["token_level_loss"] = token_level
    objective = {"surrogate": surrogate, "aggregation": {"kind": AGGREGATIONS[token_level], "count": "valid"}}
    # step_statistics="local": each call is its own step, as OpenRLHF's PolicyLoss computes it
    return (RlstabPolicyLoss(**kwargs, objective=objective, step_statistics="local"), openrlhf_policy_loss(**kwargs),
            spread)


def assert_same(ours, theirs):
    (loss, clip_ratio, ppo_kl, vllm_kl, is_filter), grad = ours
    (ref_loss, ref_clip, ref_kl, ref_vllm_kl, ref_filter), ref_grad = theirs
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(clip_ratio, ref_clip.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ppo_kl, ref_kl, rtol=1e-6, atol=1e-6)
    for value, ref in ((vllm_kl, ref_vllm_kl), (is_filter, ref_filter)):
        assert (value is None) == (ref is None)
        if ref is not None:
            torch.testing.assert_close(value, ref, rtol=1e-6, atol=1e-6)


# OpenRLHF's gspo is always sequence-level (its constructor forces token_level_loss=False)
CASES = [(m, level) for m in METHODS for level in (True, False) if not (m == "gspo" and level)]


@pytest.mark.parametrize("counts", list(COUNTS))
@pytest.mark.parametrize(("method", "token_level"), CASES, ids=[f"{m}-{'token' if t else 'sequence'}" for m, t in CASES])
def test_matches_openrlhf_policy_loss(method, token_level, counts):
    ours, theirs, spread = pair(method, token_level, "off")
    for seed in range(3):
        inputs = random_micro_batch(seed, spread=spread)
        assert_same(run(ours, inputs, COUNTS[counts]), run(theirs, inputs, COUNTS[counts]))


@pytest.mark.parametrize("correction", [c for c in CORRECTIONS if c != "off"])
@pytest.mark.parametrize("method", list(METHODS))
def test_matches_openrlhf_with_is_correction(method, correction):
    if method == "gspo" and "clip" in correction:
        correction = "token-mask-ratio"  # (clip mode is a ppo-path option; gspo ignores the mode)
    ours, theirs, spread = pair(method, method != "gspo", correction)
    for seed in range(3):
        inputs = random_micro_batch(seed, spread=spread)
        counts = COUNTS["global"]
        assert_same(run(ours, inputs, counts), run(theirs, inputs, counts))


def test_the_batches_hit_every_branch():
    """The conformance batches are not trivially inside the clip range, and the corrections filter something."""
    loss, _, _ = pair("dual-clip", True, "off")
    run(loss, random_micro_batch(0), {})
    m = loss.last_metrics
    assert m["clip/high_fraction"] > 0 and m["clip/low_fraction"] > 0 and m["clip/dual_fraction"] > 0
    loss, _, spread = pair("gspo", False, "off")
    run(loss, random_micro_batch(0, spread=spread), {})
    clipped = loss.last_metrics["clip/high_fraction"] + loss.last_metrics["clip/low_fraction"]
    assert 0 < clipped < 0.8
    for correction in CORRECTIONS:
        if correction == "off":
            continue
        loss, _, _ = pair("ppo", True, correction)
        (_, _, _, _, filtered), _ = run(loss, random_micro_batch(1), {})
        assert 0 < filtered.item() < 1, correction


# OpenRLHF's is_correction_* options as rlstab objectives of their own, compared with the adapter's
# correction neutral (clip mode, threshold 1 1: coefficient 1, and rollout_log_probs still passed).
NEUTRAL = {"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": (1.0, 1.0)}
GATES = {
    # case: (rlstab mask, OpenRLHF's correction, rollout log-prob noise)
    "seq_mask_tis": (None, {"is_correction_level": "seq", "is_correction_threshold": [0.999, 1.002]}, 0.003),
    "binary-kl-token": ({"level": "token", "divergence": "binary_kl_rollout", "high": 0.004},
                        {"is_correction_level": "token", "is_correction_gating": "binary_kl",
                         "is_correction_threshold": [0.0, 0.004]}, 0.6),
    "binary-kl-seq": ({"level": "sequence_mean", "divergence": "binary_kl_rollout", "high": 0.003},
                      {"is_correction_level": "seq", "is_correction_gating": "binary_kl",
                       "is_correction_threshold": [0.0, 0.003]}, 0.6),
}


@pytest.mark.parametrize("case", list(GATES))
def test_rollout_gates_match_openrlhf_is_correction(case):
    """seq_mask_tis (the preset) and the binary_kl_rollout rejection against OpenRLHF's own gates.

    OpenRLHF's mask mode keeps a unit iff its statistic lies in the band and then weights each kept
    token by its untruncated ratio pi_train(old)/pi_rollout, rejected tokens staying in the
    denominators: rlstab's rollout_rejection (rejected: masked) with tis (cap: null).
    """
    mask, correction, noise = GATES[case]
    if mask is None:
        preset = rlstab.load(case)
        masks, reweighters = [m.model_dump() for m in preset.masks], [w.model_dump() for w in preset.reweighters]
    else:
        masks, reweighters = [{"kind": "rollout_rejection", "rejected": "masked", **mask}], [{"kind": "tis", "cap": None}]
    objective = {"extends": "grpo", "surrogate": {"dual_clip": None}, "masks": masks, "reweighters": reweighters}
    ours = RlstabPolicyLoss(objective=objective, step_statistics="local", **NEUTRAL)
    theirs = openrlhf_policy_loss(**correction)
    filtered = []
    for seed in range(3):
        inputs = random_micro_batch(seed)
        g = torch.Generator().manual_seed(100 + seed)
        rollout = inputs["old_log_probs"] + noise * torch.randn(inputs["old_log_probs"].shape, generator=g)
        inputs["rollout_log_probs"] = rollout.clamp(max=-1e-3) * inputs["action_mask"]
        (loss, *_), grad = run(ours, inputs, COUNTS["global"])
        (ref_loss, _, _, _, ref_filter), ref_grad = run(theirs, inputs, COUNTS["global"])
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
        filtered.append(ref_filter.item())
    assert 0 < max(filtered) and min(filtered) < 1  # the gate rejects some units, not all
