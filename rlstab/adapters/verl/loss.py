"""The policy loss registered in verl as ``rlstab``.

verl calls it once per micro-batch, from ``ppo_loss``, with keywords::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)

It maps verl's tensors onto a [`TokenBatch`][rlstab.TokenBatch] (the only place verl's names
appear), turns verl's ``config.global_batch_info`` into the step's denominators, runs the
compiled objective and returns ``(loss, metrics)`` with verl's metric names.
"""

from __future__ import annotations

from dataclasses import replace

from rlstab.adapters.global_counts import number, with_global_counts
from rlstab.adapters.verl.config import CONFIG_PATH, RlstabPolicyLossConfig
from rlstab.adapters.verl.model_output import current_dp_group, current_entropy
from rlstab.adapters.verl.step_scope import prepared_step
from rlstab.batch import TokenBatch
from rlstab.compiled import CompiledObjective, StepStats
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
    batch = TokenBatch(
        logprobs=log_prob,
        response_mask=response_mask,
        old_logprobs=old_log_prob,
        advantages=advantages,
        entropy=entropy,
        is_weights=rollout_is_weights,
    )
    info = config.global_batch_info or {}
    if policy_loss.step_statistics == "optimizer_step":
        step = prepared_step()
        if step is None:
            raise RuntimeError(
                f"{CONFIG_PATH}.step_statistics = 'optimizer_step': the step's statistics are gathered by verl's "
                "TrainingWorker.train_batch before its micro-batches, and this loss was called outside it; set "
                "step_statistics=local to make each call its own step"
            )
        step = with_verl_counts(step, info, step.counts.max_length)
    else:
        across_ranks = policy_loss.step_statistics == "data_parallel" and (info.get("dp_size") or 1) > 1
        group = current_dp_group() if across_ranks else None
        update_state = policy_loss.rlstab_step_tracker.first_call_of_step()
        step = step_stats(compiled, batch, info, across_ranks, group, update_state)
    out = compiled(batch, step=step)
    return out.loss, verl_metrics(out.metrics)


def _policy_loss(config) -> RlstabPolicyLossConfig:
    policy_loss = None if config is None else config.get("policy_loss")
    if not isinstance(policy_loss, RlstabPolicyLossConfig):
        raise ValueError(
            f"loss_mode=rlstab needs {CONFIG_PATH}._target_=rlstab.adapters.verl.RlstabPolicyLossConfig "
            f"and {CONFIG_PATH}.objective=<preset or YAML path>; got {type(policy_loss).__name__}"
        )
    return policy_loss


def _is_global(info: dict) -> bool:
    """Whether verl gave step-wide denominators (otherwise the micro-batch is its own step, as in verl)."""
    return (info.get("dp_size") or 1) > 1 or any(
        info.get(k) is not None for k in ("batch_num_tokens", "global_batch_size", "loss_scale_factor")
    )


def step_stats(
    compiled: CompiledObjective,
    batch: TokenBatch,
    info: dict,
    across_ranks: bool = False,
    group=None,
    update_state: bool = True,
) -> StepStats:
    """The step statistics of one verl micro-batch, with verl's global denominators.

    Exact over the step (every micro-batch of the mini-batch, every data-parallel rank), because
    verl all-reduces them before the first micro-batch: the valid-token count
    (``batch_num_tokens``), the number of responses (``global_batch_size``), ``dp_size`` and
    ``loss_scale_factor``. Per micro-batch, because verl runs forward, loss and backward one
    micro-batch at a time and the current policy's entropy does not exist before its forward:
    mask thresholds (entropy quantiles) and the share of kept tokens, so a ``count: kept``
    denominator is the global valid count times this micro-batch's kept fraction.
    ``across_ranks``: thresholds and kept fraction over this micro-batch on every rank of
    ``group`` (a collective call). Without global info (one rank, no ``batch_num_tokens``) the
    micro-batch is its own step, as in verl. ``update_state``: advance stateful components (on the
    step's first micro-batch only).
    """
    local = compiled.gather([batch], group=group, distributed=across_ranks, update_state=update_state)
    return with_verl_counts(local, info, batch.shape[1])


def with_verl_counts(stats: StepStats, info: dict, padded_length: int) -> StepStats:
    """``stats`` with verl's global counts as the denominators (the kept share stays ``stats``'s).

    ``padded_length``: the ``max_length`` of ``seq-mean-token-sum-norm`` when verl gives no
    ``loss_scale_factor`` (verl's own losses then take the micro-batch's padded length).
    """
    if not _is_global(info):
        return stats
    dp_size = int(info.get("dp_size") or 1)
    tokens = number(info.get("batch_num_tokens"))
    sequences = number(info.get("global_batch_size"))
    if dp_size > 1 and (tokens is None or sequences is None):
        raise ValueError(
            "dp_size > 1 needs the global batch_num_tokens and global_batch_size in config.global_batch_info "
            "(verl's ppo_loss sets them)"
        )
    scale_factor = info.get("loss_scale_factor")
    max_length = padded_length if scale_factor is None else int(scale_factor)
    counts = with_global_counts(stats.counts, tokens=tokens, sequences=sequences, max_length=max_length, world_size=dp_size)
    return replace(stats, counts=counts)


def verl_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """verl's standard policy metrics, then every rlstab metric under ``actor/rlstab/``.

    ``actor/pg_clipfrac``: tokens clipped by the PPO range (either side); ``actor/pg_clipfrac_lower``:
    negative-advantage tokens bounded by dual-clip; ``actor/ppo_kl``: mean of -log r. verl averages
    these over micro-batches and ranks, so counts under ``actor/rlstab/`` are per micro-batch.
    """
    out = {
        "actor/pg_clipfrac": metrics.get("clip/high_fraction", 0.0) + metrics.get("clip/low_fraction", 0.0),
        "actor/ppo_kl": metrics["approx_kl"],
        "actor/pg_clipfrac_lower": metrics.get("clip/dual_fraction", 0.0),
    }
    out.update({f"actor/rlstab/{name}": value for name, value in metrics.items() if name != "loss"})
    return out
