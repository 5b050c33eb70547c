"""The rlstab-vespo plugin (examples/rlstab-vespo) against TRL 1.16.0's own VESPO: loss and gradients.

TRL's ``loss_type="vespo"`` (trl/trainer/grpo_trainer.py) takes the detached per-response weight
from the static ``GRPOTrainer.get_gamma_weights`` and, in ``_compute_loss``, computes
``per_token_loss = -phi_seq * advantages * per_token_logps``, summed over the completion mask and
divided by ``num_items_in_batch`` (the dapo normaliser: the generation batch's tokens, rescaled to
one accumulation window), i.e. rlstab's ``token-mean`` over valid tokens. With vLLM's IS correction
on, TRL folds the per-token ``importance_sampling_ratio`` (``token_truncate``: exp(old - sampling)
capped at ``vllm_importance_sampling_clip_max``) into the weight instead of multiplying the loss by
it: the plugin's ``rollout_correction`` with ``rollout_cap`` and the engine's log-probabilities as
``rollout_logprobs``.

The first tests call TRL's real ``get_gamma_weights`` and write out the few lines of its vespo
branch around it (no trainer); the last runs TRL's whole ``_compute_loss`` against
``RlstabGRPOTrainer`` on the tiny model. The plugin must be installed in this environment
(``pip install ./examples/rlstab-vespo``); rlstab finds it through the ``rlstab.components`` entry
point.
"""

import pytest
import rlstab_vespo  # noqa: F401 - installed by scripts/test.sh; a missing plugin is a failure, not a skip
import torch
from trl import GRPOTrainer

import rlstab

from trl_tiny import crafted_inputs, last_metrics, loss_and_grads, trainer_pair

TOKEN_MEAN = {"kind": "token-mean", "count": "valid"}
B, T = 6, 9


def objective(**surrogate) -> dict:
    return {"extends": "grpo", "surrogate": {"kind": "vespo", **surrogate}, "aggregation": TOKEN_MEAN}


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


def trl_importance_sampling_ratio(x, clip_max: float | None) -> torch.Tensor:
    """``_generate_and_score_completions`` with ``vllm_importance_sampling_mode="token_truncate"``."""
    diff = torch.nan_to_num((x["old"] - x["sampling"]) * x["mask"], nan=0.0)
    ratio = torch.exp(diff)
    return ratio if clip_max is None else torch.clamp(ratio, min=None, max=clip_max)


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
    """TRL's vLLM token_truncate ratio folded into W = the plugin's rollout_correction (cap = clip_max).

    ``clip_max = None``: the uncapped ratio, as the authors' code folds rollout IS weights it is handed."""
    x = random_inputs(seed)
    theirs = trl_loss_and_grad(x, is_ratio=trl_importance_sampling_ratio(x, clip_max))
    ours = rlstab_loss_and_grad(x, {"rollout_correction": True, "rollout_cap": clip_max})
    assert_same(theirs, ours)
    plain = trl_loss_and_grad(x)
    assert (theirs[0] - plain[0]).abs() > 1e-4  # the ratio did change the loss


# (gradient_accumulation_steps, steps_per_generation, num_items_in_batch or None = the micro-batch's tokens)
ACCUMULATION = {"ga1": (1, 1, None), "ga2": (2, 2, 57.0), "ga4-spg2": (4, 2, 31.0)}


@pytest.mark.parametrize("accumulation", list(ACCUMULATION))
def test_plugin_matches_trls_compute_loss(tmp_path, accumulation):
    """TRL's whole ``_compute_loss`` with ``loss_type="vespo"`` against RlstabGRPOTrainer with the plugin's surrogate.

    Both trainers take their log-probabilities from the same tiny Llama; ``spread`` puts the old ones
    far enough off that phi leaves 1. The model's parameter gradients are compared."""
    ga, spg, items = ACCUMULATION[accumulation]
    shared = {"gradient_accumulation_steps": ga, "steps_per_generation": spg}
    theirs, ours = trainer_pair(tmp_path, objective(), {"loss_type": "vespo", **shared}, shared)
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed, spread=0.5, num_items_in_batch=items)
        loss, grads = loss_and_grads(theirs, inputs, ga)
        our_loss, our_grads = loss_and_grads(ours, inputs, ga)
        torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
        assert grads.keys() == our_grads.keys()
        for name in grads:
            torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
        assert loss.abs() > 1e-3
        assert abs(last_metrics(theirs)["vespo/phi_seq_mean"] - 1.0) > 0.05  # the kernel is not at phi(1) = 1
