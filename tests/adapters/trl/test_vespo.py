"""rlstab's built-in ``vespo`` surrogate and preset against TRL 1.16.0's own VESPO: loss and gradients.

TRL's ``loss_type="vespo"`` (trl/trainer/grpo_trainer.py) takes the detached per-response weight
from the static ``GRPOTrainer.get_gamma_weights`` and, in ``_compute_loss``, computes
``per_token_loss = -phi_seq * advantages * per_token_logps``, summed over the completion mask and
divided by ``num_items_in_batch`` (the dapo normaliser: the generation batch's tokens, rescaled to
one accumulation window), i.e. rlstab's ``token-mean`` over valid tokens. With vLLM's IS correction
on, TRL folds the per-token ``importance_sampling_ratio`` (``token_truncate``: exp(old - sampling)
capped at ``vllm_importance_sampling_clip_max``) into the weight instead of multiplying the loss by
it: the surrogate's ``rollout_correction`` with ``rollout_cap`` (and ``rollout_floor``, TRL's
``vllm_importance_sampling_clip_min``) and the engine's log-probabilities as ``rollout_logprobs``;
``token_mask`` zeroes a ratio outside [clip_min, clip_max], which ``get_gamma_weights`` turns into
log 1e-8: ``rollout_bounds: mask``.

The first tests call TRL's real ``get_gamma_weights`` and write out the few lines of its vespo
branch around it (no trainer); the last run TRL's whole ``_compute_loss`` against
``RlstabGRPOTrainer`` on the tiny model: the ``vespo`` preset at TRL's defaults (no vLLM), and the
folded vLLM ratio (``use_vllm`` set on both trainers after they are built, as
``test_catalogue_second_wave.py`` does: vLLM does not run on CPU).
"""

import math

import pytest
import torch
from trl import GRPOTrainer

import rlstab

from trl_tiny import crafted_inputs, last_metrics, loss_and_grads, trainer_pair

B, T = 6, 9


def objective(**surrogate) -> dict:
    return {"extends": "vespo", "surrogate": surrogate} if surrogate else "vespo"


def random_inputs(seed: int, per_token: bool = False, extreme: bool = False) -> dict[str, torch.Tensor]:
    """Log-probabilities, old ones off by noise (so phi ranges from ~0 to above 1), advantages of both signs,
    ragged completion masks with an empty and a full row, and the engine's log-probabilities near the old ones.

    ``extreme``: row 1's sequence log-ratio far above 20 and row 2's far below log 1e-8 (both clamps)."""
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(B, T, generator=g) * 3.0 - 5.0  # within [-8, -5]: the old and the engine's stay below 0
    old = logprobs + 0.7 * torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = 0, T
    if extreme:
        lengths[1] = lengths[2] = T
        old[1] = logprobs[1] - 4.0  # log W = 36 -> 20
        old[2] = logprobs[2] + 4.0  # log W = -36 -> log 1e-8
    mask = (torch.arange(T) < lengths[:, None]).long()  # TRL's completion_mask is an integer tensor
    advantages = torch.randn(B, T, generator=g) if per_token else torch.randn(B, generator=g)
    sampling = old + 0.4 * torch.randn(B, T, generator=g)
    return {"logprobs": logprobs, "old": old, "mask": mask, "advantages": advantages, "sampling": sampling}


def trl_importance_sampling_ratio(x, clip_max: float | None, clip_min: float | None = None,
                                  mode: str = "token_truncate") -> torch.Tensor:
    """``_generate_and_score_completions``'s vLLM ratio for the token modes (the two VESPO accepts), written out."""
    diff = torch.nan_to_num((x["old"] - x["sampling"]) * x["mask"], nan=0.0)
    ratio = torch.exp(diff)
    if mode == "token_truncate":
        return ratio if clip_max is None and clip_min is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def trl_loss_and_grad(x, is_ratio=None, **params):
    """TRL's vespo branch of ``_compute_loss`` on one micro-batch (one process, GA = spg = 1, train)."""
    per_token_logps = x["logprobs"].clone().requires_grad_()
    advantages = x["advantages"]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    mask = x["mask"]
    log_ratio = per_token_logps - x["old"]
    phi_seq = GRPOTrainer.get_gamma_weights(
        advantages=advantages,
        log_ratio_per_token=log_ratio,
        mask=mask,
        importance_sampling_ratio=is_ratio,
        **params,
    )
    per_token_loss = -phi_seq * advantages * per_token_logps
    normalizer = torch.tensor(float(mask.sum())).clamp(min=1.0)  # num_items_in_batch of this step
    loss = (per_token_loss * mask).sum() / normalizer
    loss.backward()
    return loss.detach(), per_token_logps.grad, phi_seq


def rlstab_loss_and_grad(x, surrogate: dict):
    logprobs = x["logprobs"].clone().requires_grad_()
    batch = rlstab.TokenBatch(
        logprobs=logprobs,
        old_logprobs=x["old"],
        advantages=x["advantages"],
        response_mask=x["mask"].bool(),
        rollout_logprobs=x["sampling"],
    )
    out = rlstab.load(objective(**surrogate)).compile()(batch)
    out.loss.backward()
    return out.loss.detach(), logprobs.grad, out.metrics


def assert_same(theirs, ours):
    loss, grad = theirs[:2]
    our_loss, our_grad = ours[:2]
    torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(our_grad, grad, rtol=1e-6, atol=1e-7)
    assert loss.abs() > 1e-3  # a real loss, not two zeros


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_vespo_matches_trls_gamma_weights(seed, per_token, extreme):
    x = random_inputs(seed, per_token=per_token, extreme=extreme)
    theirs = trl_loss_and_grad(x)
    ours = rlstab_loss_and_grad(x, {})
    assert_same(theirs, ours)
    if not extreme:
        phi = theirs[2].expand(B, T)[x["mask"].bool()]
        assert (phi < 0.5).any() and (phi > 0.9).any()  # both ends of the kernel, not only phi ~ 1
    else:
        assert (theirs[2][1] == 0).all()  # log W clamped at 20: phi underflows to 0
        assert (theirs[2][2] < 1e-12).all()  # log W clamped at log 1e-8: phi ~ e^lambda 1e-8^k


def test_non_default_parameters_are_trls_vespo_fields():
    params = {"k_pos": 1.5, "lambda_pos": 0.7, "k_neg": 4.0, "lambda_neg": 2.5}
    for seed in range(3):
        x = random_inputs(seed)
        assert_same(trl_loss_and_grad(x, **params), rlstab_loss_and_grad(x, params))


@pytest.mark.parametrize("clip_max", [3.0, 1.2, None])
@pytest.mark.parametrize("seed", range(3))
def test_rollout_correction_is_trls_folded_importance_sampling_ratio(seed, clip_max):
    """TRL's vLLM token_truncate ratio folded into W = the surrogate's rollout_correction (cap = clip_max).

    ``clip_max = None``: the uncapped ratio, as the authors' code folds rollout IS weights it is handed."""
    x = random_inputs(seed)
    theirs = trl_loss_and_grad(x, is_ratio=trl_importance_sampling_ratio(x, clip_max))
    ours = rlstab_loss_and_grad(x, {"rollout_correction": True, "rollout_cap": clip_max})
    assert_same(theirs, ours)
    plain = trl_loss_and_grad(x)
    assert (theirs[0] - plain[0]).abs() > 1e-4  # the ratio did change the loss


@pytest.mark.parametrize("clip_min", [0.5, None])
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
@pytest.mark.parametrize("seed", range(3))
def test_rollout_band_is_trls_clip_min_clip_max_and_mode(seed, mode, clip_min):
    """clip_min / clip_max and token_truncate / token_mask = rollout_floor / rollout_cap and rollout_bounds."""
    x = random_inputs(seed)
    x["sampling"] = x["old"] + 0.8 * torch.randn(B, T, generator=torch.Generator().manual_seed(50 + seed))
    is_ratio = trl_importance_sampling_ratio(x, 3.0, clip_min, mode)
    theirs = trl_loss_and_grad(x, is_ratio=is_ratio)
    bounds = "truncate" if mode == "token_truncate" else "mask"
    surrogate = {"rollout_correction": True, "rollout_cap": 3.0, "rollout_floor": clip_min, "rollout_bounds": bounds}
    assert_same(theirs, rlstab_loss_and_grad(x, surrogate))
    valid = x["mask"].bool()
    assert ((is_ratio[valid] == 0) | (is_ratio[valid] == 3.0) | (is_ratio[valid] == (clip_min or -1))).any()  # binds


def test_preset_matches_trls_compute_loss_off_phi_one(tmp_path):
    """TRL's whole ``_compute_loss`` with ``loss_type="vespo"`` at TRL's defaults against RlstabGRPOTrainer with the preset.

    Both trainers take their log-probabilities from the same tiny Llama; ``spread`` puts the old ones
    far enough off that phi leaves 1. The model's parameter gradients are compared. (Every
    accumulation setting: ``test_conformance.py::test_preset_matches_trl_loss_type[vespo-*]``.)"""
    theirs, ours = trainer_pair(tmp_path, objective(), {"loss_type": "vespo"})
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed, spread=0.5)
        loss, grads = loss_and_grads(theirs, inputs)
        our_loss, our_grads = loss_and_grads(ours, inputs)
        torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
        assert grads.keys() == our_grads.keys()
        for name in grads:
            torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
        assert loss.abs() > 1e-3
        assert abs(last_metrics(theirs)["vespo/phi_seq_mean"] - 1.0) > 0.05  # the kernel is not at phi(1) = 1


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
def test_folded_vllm_ratio_matches_trls_compute_loss(tmp_path, mode):
    """With vLLM's correction TRL folds its ratio into W: the preset with rollout_correction and TRL's band.

    TRL's ratio is computed by its rule (``trl_importance_sampling_ratio``, clip_min 0.5, clip_max 3.0)
    and handed to its ``_compute_loss``; rlstab reads ``sampling_per_token_logps`` (a NaN on one token:
    the adapter gives it the old log-probability, TRL's ratio 1) and sets
    ``vllm_importance_sampling_correction=False`` (its config refuses both corrections at once)."""
    surrogate = {"rollout_correction": True, "rollout_cap": 3.0, "rollout_floor": 0.5,
                 "rollout_bounds": "truncate" if mode == "token_truncate" else "mask"}
    trl_fields = {"loss_type": "vespo", "vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_min": 0.5}
    theirs, ours = trainer_pair(tmp_path, "vespo", trl_fields)
    ours.rlstab_objective = rlstab.load(objective(**surrogate))  # reads rollout_logprobs: refused without vLLM
    ours.rlstab_compiled = ours.rlstab_objective.compile()
    theirs.use_vllm = ours.use_vllm = True
    theirs.vllm_importance_sampling_correction, ours.vllm_importance_sampling_correction = True, False
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed, spread=0.5)
        g = torch.Generator().manual_seed(100 + seed)
        sampled = inputs["old_per_token_logps"] + 0.8 * torch.randn(inputs["old_per_token_logps"].shape, generator=g)
        sampled[2, 0] = math.nan  # a token vLLM could not score
        inputs["sampling_per_token_logps"] = sampled
        x = {"old": inputs["old_per_token_logps"], "sampling": sampled, "mask": inputs["completion_mask"]}
        inputs["importance_sampling_ratio"] = trl_importance_sampling_ratio(x, 3.0, 0.5, mode)
        loss, grads = loss_and_grads(theirs, inputs)
        our_loss, our_grads = loss_and_grads(ours, inputs)
        torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
        assert grads.keys() == our_grads.keys()
        for name in grads:
            torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
        assert loss.abs() > 1e-4
