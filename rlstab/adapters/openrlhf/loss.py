"""``RlstabPolicyLoss``: OpenRLHF's ``PolicyLoss`` with an rlstab objective deciding the loss.

OpenRLHF 0.11.2's ``ActorPPOTrainer`` builds ``PolicyLoss(clip_eps_low=..., ..., is_correction_threshold=...)``
in its constructor and calls it once per micro-batch in ``training_step``::

    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = actor_loss_fn(
        action_log_probs, old_action_log_probs, advantages, action_mask=..., rollout_log_probs=...,
        dp_size=..., batch_num_tokens=..., global_batch_size=...)

This subclass keeps that constructor and that call, maps OpenRLHF's tensors onto a
[`TokenBatch`][rlstab.TokenBatch] ([`inputs`][rlstab.adapters.openrlhf.inputs]), turns OpenRLHF's
global counts into the step's denominators ([`counts`][rlstab.adapters.openrlhf.counts]), and
returns the same 5-tuple with OpenRLHF's meanings.

Where the step's statistics come from (``step_statistics``): ``optimizer_step`` (default) uses the
statistics that [`step_scope`][rlstab.adapters.openrlhf.step_scope] gathered over the whole
optimizer step on every data-parallel rank before the step's first micro-batch; ``local`` makes each
micro-batch its own step (no communication), as the adapter did before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rlstab.adapters.openrlhf.config import (
    build_objective,
    check_rollout_source,
    check_step_statistics,
    double_correction,
    objective_from_env,
    step_statistics_from_env,
)
from rlstab.adapters.openrlhf.counts import step_stats, with_trainer_counts
from rlstab.adapters.openrlhf.entropy import entropy_of
from rlstab.adapters.openrlhf.inputs import token_batch
from rlstab.adapters.openrlhf.is_correction import ISCorrection
from rlstab.adapters.openrlhf.source import loss_module
from rlstab.adapters.optimizer_steps import StepTracker
from rlstab.adapters.prepared_step import prepared_step
from rlstab.aggregation import TokenMean
from rlstab.clipping import GSPO, PPOClip
from rlstab.lazy import torch
from rlstab.objective import Objective

if TYPE_CHECKING:
    from rlstab.batch import TokenBatch
    from rlstab.compiled import CompiledObjective, StepStats

_log = logging.getLogger(__name__)

PolicyLoss = loss_module().PolicyLoss


class RlstabPolicyLoss(PolicyLoss):
    """A drop-in ``openrlhf.models.loss.PolicyLoss`` whose policy term is an rlstab objective.

    OpenRLHF's own arguments are accepted, and validated by OpenRLHF's constructor, so that
    ``ActorPPOTrainer`` builds this class unchanged. The objective's surrogate and aggregation
    replace ``clip_eps_low``, ``clip_eps_high``, ``dual_clip``, ``token_level_loss`` and
    ``policy_loss_type`` (a warning lists those that disagree with the objective). The
    train/rollout importance-sampling correction (``is_correction_level``, ``_mode``,
    ``_gating``, ``_threshold``) is applied as OpenRLHF applies it (module
    ``rlstab.adapters.openrlhf.is_correction``).

    Args:
        objective: a preset name, a YAML path, a dict or an [`Objective`][rlstab.Objective].
            None: the objective in ``$RLSTAB_OPENRLHF_OBJECTIVE``, which the launcher sets in every
            Ray worker. This is how the trainer's own ``PolicyLoss(...)`` call, which cannot pass
            an objective, gets one: the worker's environment is the one channel from the launcher
            to that constructor, and it is the same in every worker.
        overrides: fields merged over a preset or YAML ``objective``, as ``extends:`` would.
        step_statistics: ``"optimizer_step"`` or ``"local"``; None: ``$RLSTAB_OPENRLHF_STEP_STATISTICS``
            (set by the launcher's ``--step-statistics``), ``"optimizer_step"`` when unset.
            ``optimizer_step``: thresholds, kept counts and the stateful components' step come from
            the whole optimizer step on every data-parallel rank, gathered by the wrapped
            ``ActorPPOTrainer.ppo_train`` before the step's first micro-batch; a call outside
            ``ppo_train`` (no statistics prepared for it) raises rather than quietly making the
            micro-batch its own step, which would change the method. ``local``: each micro-batch
            is its own step; a stateful component whose value comes from its state alone
            (``value_from_state``) measures every micro-batch of the optimizer step and moves once,
            and one that reads the whole step or training batch (BAPO, STARE) is refused when the
            trainer is built ([`step_parts`][rlstab.adapters.step_parts]).
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float | None = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold=(0.5, 5.0),
        *,
        objective: str | dict | Objective | None = None,
        overrides: dict | None = None,
        step_statistics: str | None = None,
    ) -> None:
        super().__init__(
            clip_eps_low=clip_eps_low,
            clip_eps_high=clip_eps_high,
            dual_clip=dual_clip,
            token_level_loss=token_level_loss,
            policy_loss_type=policy_loss_type,
            is_correction_level=is_correction_level,
            is_correction_mode=is_correction_mode,
            is_correction_gating=is_correction_gating,
            is_correction_threshold=is_correction_threshold,
        )
        if objective is None and overrides is None:
            self.objective = objective_from_env()
        else:
            self.objective = build_objective(objective, overrides, label="RlstabPolicyLoss(objective=...)")
        # OpenRLHF builds this loss when its actor starts: refuse here, not at the first micro-batch
        check_rollout_source(self.objective, is_correction_level, "RlstabPolicyLoss(is_correction_level=...)")
        self.compiled: CompiledObjective = self.objective.compile()
        if step_statistics is None:
            self.step_statistics = step_statistics_from_env()
        else:
            self.step_statistics = check_step_statistics(step_statistics, "RlstabPolicyLoss(step_statistics=...)")
        low, high = is_correction_threshold
        self.is_correction = ISCorrection(is_correction_level, is_correction_mode, is_correction_gating, low, high)
        twice = double_correction(self.objective, is_correction_level, is_correction_mode, is_correction_threshold)
        if twice is not None:
            _log.warning("rlstab: %s", twice)
        self.step_tracker = StepTracker()  # stateful components advance once per optimizer step
        self._last_metrics: Mapping[str, float] = {}
        ignored = openrlhf_settings_ignored(self)
        if ignored:
            _log.warning("rlstab objective %r replaces OpenRLHF's policy loss; ignored: %s",
                         self.objective.name or "custom", "; ".join(ignored))

    @property
    def last_metrics(self) -> dict[str, float]:
        """rlstab's metrics of the last micro-batch (``mask/s2t/silenced``, ``tokens/kept_fraction``, ...).

        Read from the device here, at the first access (after the backward, where OpenRLHF's
        ``training_step`` logs them), not in the loss call.
        """
        return dict(self._last_metrics)

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens=None,
        global_batch_size=None,
    ):
        """``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)`` with OpenRLHF's meanings.

        ``clip_ratio``: fraction of valid tokens whose (sequence) ratio the clip range cuts
        (dual-clipped tokens are not counted, as in OpenRLHF); ``ppo_kl``: mean of
        ``old_log_probs - log_probs`` over valid tokens; ``vllm_kl`` and ``is_filter_ratio``:
        OpenRLHF's importance-sampling diagnostics, None when the correction is off.
        """
        if action_mask is None:
            raise ValueError("RlstabPolicyLoss needs action_mask (OpenRLHF's training_step always passes it)")
        compiled = self.compiled
        entropy = entropy_of(log_probs)
        if entropy is None and compiled.readers("entropy"):
            raise ValueError(
                f"{', '.join(compiled.readers('entropy'))} of objective {self.objective.name or 'custom'!r} reads the "
                "per-token entropy, but these log-probs carry none: the rlstab hook did not wrap Actor.forward in this "
                "process. Start the run with `python -m rlstab.adapters.openrlhf --objective ...`"
            )
        if rollout_log_probs is None and compiled.readers("rollout_logprobs"):
            raise ValueError(
                f"{', '.join(compiled.readers('rollout_logprobs'))} reads vLLM's log-probabilities, which OpenRLHF "
                "records only with --algo.advantage.is_correction_level token|seq (its correction then applies too)"
            )
        batch, vllm_kl, is_filter_ratio = token_batch(
            self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, entropy
        )
        if self.step_statistics == "optimizer_step":
            step = self._prepared(batch, dp_size, batch_num_tokens, global_batch_size)
        else:
            update_state = self.step_tracker.first_call_of_step()
            step = step_stats(compiled, batch, dp_size, batch_num_tokens, global_batch_size, update_state)
        out = compiled(batch, step=step)
        self._last_metrics = out.metrics  # read by the training_step wrapper, after the backward
        metrics = out.metrics
        clip = metrics.unread("clip/high_fraction") + metrics.unread("clip/low_fraction")  # nothing read here
        if isinstance(clip, torch.Tensor):
            clip_ratio = clip.to(torch.float32)
        else:  # a surrogate without clip metrics: a fill, no host-to-device copy
            clip_ratio = torch.full((), clip, dtype=torch.float32, device=log_probs.device)
        valid = batch.response_mask.to(torch.float32)
        ppo_kl = ((old_log_probs.detach().float() - log_probs.detach().float()) * valid).sum() / valid.sum()
        return out.loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio

    def _prepared(self, batch: TokenBatch, dp_size, batch_num_tokens, global_batch_size) -> StepStats:
        """The optimizer step's statistics gathered before its first micro-batch, with OpenRLHF's global counts."""
        prepared = prepared_step()
        if prepared is None:
            raise RuntimeError(
                "RlstabPolicyLoss(step_statistics='optimizer_step') was called without the optimizer step's statistics: "
                "they are gathered by ActorPPOTrainer.ppo_train, wrapped by rlstab's hook (start the run with "
                "`python -m rlstab.adapters.openrlhf`). To make each micro-batch its own step (statistics from this "
                "micro-batch alone), use step_statistics='local' (launcher: --step-statistics local)"
            )
        return with_trainer_counts(
            self.compiled, prepared.stats, dp_size, batch_num_tokens, global_batch_size, prepared.counted
        )


def openrlhf_settings_ignored(loss: RlstabPolicyLoss) -> list[str]:
    """OpenRLHF's policy-loss arguments that differ from what the objective does (the objective wins)."""
    objective, out = loss.objective, []
    surrogate = objective.surrogate
    wanted_type = "gspo" if isinstance(surrogate, GSPO) else "ppo"
    if loss.policy_loss_type != wanted_type:
        out.append(f"policy_loss_type={loss.policy_loss_type!r} (the objective's surrogate is {surrogate.kind!r})")
    if isinstance(surrogate, PPOClip | GSPO):
        if (loss.clip_eps_low, loss.clip_eps_high) != (surrogate.eps_low, surrogate.eps_high):
            out.append(
                f"clip range {loss.clip_eps_low:g}/{loss.clip_eps_high:g} (the objective's is "
                f"{surrogate.eps_low:g}/{surrogate.eps_high:g})"
            )
        if loss.dual_clip != surrogate.dual_clip:
            out.append(f"dual_clip={loss.dual_clip} (the objective's is {surrogate.dual_clip})")
    token_level = isinstance(objective.aggregation, TokenMean)
    if loss.token_level_loss != token_level and loss.policy_loss_type != "gspo":
        out.append(f"loss_agg_mode {'token-mean' if loss.token_level_loss else 'seq-mean-token-mean'} "
                   f"(the objective aggregates with {objective.aggregation.kind})")
    return out
