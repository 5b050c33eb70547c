"""The policy loss registered in verl as ``rlstab``.

verl calls it once per micro-batch, from ``ppo_loss``, with keywords::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)

It maps verl's tensors onto a [`TokenBatch`][rlstab.TokenBatch] ([`inputs`][rlstab.adapters.verl.inputs]),
takes the step's statistics (prepared by the [`step_scope`][rlstab.adapters.verl.step_scope], or this
micro-batch's own) with verl's ``config.global_batch_info`` as the denominators
([`counts`][rlstab.adapters.verl.counts]), runs the compiled objective and returns ``(loss, metrics)``
with verl's metric names, each combined over the step's micro-batches as it declares
([`metrics`][rlstab.adapters.verl.metrics]).
"""

from __future__ import annotations

from rlstab.adapters.prepared_step import prepared_step
from rlstab.adapters.verl.config import CONFIG_PATH, RlstabPolicyLossConfig
from rlstab.adapters.verl.counts import step_stats, with_trainer_counts
from rlstab.adapters.verl.inputs import token_batch
from rlstab.adapters.verl.metrics import step_combined, verl_metrics
from rlstab.adapters.verl.model_output import current_dp_group, current_entropy, declare_metrics
from rlstab.lazy import torch


def rlstab_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy-loss signature over an rlstab objective (``config.policy_loss.objective``).

    ``loss_agg_mode`` is not used: the objective's own ``aggregation`` decides the policy term
    (verl still uses ``loss_agg_mode`` for its entropy bonus and KL loss). ``rollout_is_weights``
    multiply each token's policy loss, as in verl's built-in losses.
    """
    policy_loss = _policy_loss(config)
    compiled = policy_loss.rlstab_compiled
    entropy = current_entropy()
    if entropy is None and compiled.readers("entropy"):
        raise ValueError(
            f"{', '.join(compiled.readers('entropy'))} of objective {compiled.objective.name or 'custom'!r} reads the "
            "per-token entropy, but the model output has none: set actor_rollout_ref.actor.calculate_entropy=True"
        )
    batch = token_batch(
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
        entropy=entropy,
        rollout_is_weights=rollout_is_weights,
    )
    info = config.global_batch_info or {}
    if policy_loss.step_statistics == "optimizer_step":
        prepared = prepared_step()
        if prepared is None:
            raise RuntimeError(
                f"{CONFIG_PATH}.step_statistics = 'optimizer_step': the step's statistics are gathered by verl's "
                "TrainingWorker.train_batch before its micro-batches, and this loss was called outside it; set "
                "step_statistics=local to make each call its own step"
            )
        step = with_trainer_counts(prepared.stats, info, prepared.stats.counts.max_length, prepared.counted)
    else:
        across_ranks = policy_loss.step_statistics == "data_parallel" and (info.get("dp_size") or 1) > 1
        group = current_dp_group() if across_ranks else None
        update_state = policy_loss.rlstab_step_tracker.first_call_of_step()
        step = step_stats(compiled, batch, info, across_ranks, group, update_state)
    out = compiled(batch, step=step)
    declare_metrics(step_combined(out.metrics, info))
    return out.loss, verl_metrics(out.metrics)


def _policy_loss(config) -> RlstabPolicyLossConfig:
    policy_loss = None if config is None else config.get("policy_loss")
    if not isinstance(policy_loss, RlstabPolicyLossConfig):
        raise ValueError(
            f"loss_mode=rlstab needs {CONFIG_PATH}._target_=rlstab.adapters.verl.RlstabPolicyLossConfig "
            f"and {CONFIG_PATH}.objective=<preset or YAML path>; got {type(policy_loss).__name__}"
        )
    return policy_loss
