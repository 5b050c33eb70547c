"""VCPO's off-policy optimal baseline: a group baseline weighted by each response's gradient variance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import Field, model_validator

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.batch import BatchError
from rlstab.lazy import torch

# log W is clamped here before exp in float64 (exp(700) ~ 1e304), so no weight is infinite.
_MAX_LOG_WEIGHT = 700.0


def weighted_baseline(
    values: torch.Tensor, weights: torch.Tensor, aggregate: str = "mean", eps: float = 1e-8,
    lower: float = 0.05, upper: float = 0.95,
) -> torch.Tensor:
    """One baseline from ``values`` and non-negative ``weights`` (1-D, float64), as the authors' helpers.

    - ``mean``: ``sum W v / (sum W + eps)`` (``get_weighted_mean``);
    - ``median``: the smallest value whose cumulative weight (values sorted) reaches half the total
      (``get_weighted_median``);
    - ``winsorized_mean``: values clipped to the weighted ``lower`` and ``upper`` quantiles (found as
      the median is), then the weighted mean (``get_weighted_winsorized_mean``).

    No value, or a total weight of 0: 0 for median and winsorized mean; the mean is 0 by its formula.
    """
    if values.numel() == 0:
        return values.new_zeros(())
    if aggregate == "mean":
        return (values * weights).sum() / (weights.sum() + eps)
    total = weights.sum()
    if total == 0:
        return values.new_zeros(())
    order = torch.argsort(values, stable=True)
    sorted_values, cumulative = values[order], torch.cumsum(weights[order], 0)

    def quantile(q: float) -> torch.Tensor:
        index = torch.searchsorted(cumulative, q * total).clamp(max=values.numel() - 1)
        return sorted_values[index]

    if aggregate == "median":
        return quantile(0.5)
    clipped = values.clamp(min=quantile(lower), max=quantile(upper))
    return (clipped * weights).sum() / (total + eps)


def _ess_fraction(weights: torch.Tensor) -> torch.Tensor:
    """``(sum W)^2 / sum W^2 / n``, scaled by the largest weight first (W up to e^700 squares past float64); 0 without weight."""
    if weights.numel() == 0 or not bool((weights > 0).any()):
        return weights.new_zeros(())
    w = weights / weights.max()
    return w.sum() ** 2 / (w * w).sum() / weights.numel()


@dataclass(frozen=True)
class OPOBState:
    """The step's baselines: per group (``table`` keys), or one for the step; and what they are weighted from.

    ``table`` holds the groups' reward mean, unbiased std and size; ``baseline`` one value per group
    (group scope) or a 1-element tensor (step scope); ``population_std`` each group's std with
    ``unbiased=False`` (the authors' ``norm_by_std``); ``weight_ess`` the ESS fraction of the
    weights in each scope, ``(sum W)^2 / sum W^2 / n`` (1: uniform, 1/n: one response dominates).
    """

    table: GroupTable
    baseline: torch.Tensor
    population_std: torch.Tensor
    weight_ess: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    """``step_metrics``, computed once when the step is fitted (their sizes depend on which groups have responses)."""


class OffPolicyOptimalBaseline(AdvantageEstimator):
    r"""VCPO's off-policy optimal baseline (OPOB): the minimum-variance baseline under stale rollouts.

    $$b_g = \frac{\sum_{i \in g} W_i R_i}{\sum_{i \in g} W_i + \epsilon},\qquad
      W_i = \bigl\|\nabla_\theta \log\pi_\theta(\tau_i)\bigr\|^2\, w_i^2\,\bigl(L_i^{-2}\bigr),\qquad
      A_i = \frac{R_i - b_g}{\sigma_g}\ (\texttt{normalize\_std})\ \text{or}\ R_i - b_g$$

    "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (VCPO, arXiv 2602.17616); the
    authors' code (github mit-han-lab/vcpo) computes it in ``compute_opob_baseline``
    (``recipe/fully_async_policy/staleness_utils.py``) and applies it in the Megatron actor's
    per-trajectory update, which accumulates each trajectory's gradient scaled by ``R_i / sigma_g``
    and subtracts ``b_g / sigma_g`` times the sum of score gradients: the advantage above. The
    variance of ``sum_i w_i (R_i - b) grad log pi(tau_i)`` is smallest at this ``b``, so a response
    whose gradient is large, or whose importance weight is, pulls the baseline toward its reward.

    - ``w_i = exp(sum_t log pi_old(y_t) - log pi_infer(y_t))``, the sequence importance ratio over
      the response's valid tokens (the authors' ``rollout_seq_is``; ``clip`` caps it, their
      ``use_clipped_is_ratios`` at the rollout IS threshold); ``importance_weights: false`` drops it.
    - ``||grad log pi(tau_i)||^2`` is ``TokenBatch.grad_sq_norms``: the squared norm of the gradient of
      ``sum_t log pi(y_t)`` over the response, supplied by the trainer (rlstab's embedded trainer
      backpropagates each response on its own). The authors measure the gradient of their
      per-trajectory loss at advantage 1, whose token-mean divides the score by the length: that is
      ``normalize_by_length: true`` here (their option of the same name divides by L^2 once more).
    - ``scope: group`` takes ``v_i = R_i`` within each prompt group; ``scope: step`` one baseline over
      the step (the authors' ``minibatch``; rlstab's step is the optimizer step's mini-batch) of the
      GRPO advantages ``v_i = (R_i - mean_g R) / (std_g R + 1e-6)``, and ``A_i = v_i - b``.
    - ``normalize_std`` (group scope) divides by the group's population std (``unbiased=False``) when
      it exceeds 1e-8, as the authors' ``norm_by_std``.

    Defaults are the authors' config (``actor.yaml``: group scope, weighted mean, IS weights on,
    unclipped, no length normalisation, no std); their VCPO scripts set ``norm_by_std=True``, as the
    ``vcpo`` preset does. With every ``W_i`` equal the baseline is the group mean (up to
    ``eps``). W is computed in float64 from ``log W`` (clamped at 700), so a heavy-tailed ratio
    cannot overflow; the authors use float32 products.
    """

    kind: Literal["opob"] = "opob"
    scope: Literal["group", "step"] = "group"
    """``group``: one baseline per prompt group, of rewards; ``step``: one for the step, of GRPO advantages."""
    aggregate: Literal["mean", "median", "winsorized_mean"] = "mean"
    """How the weighted values become the baseline (the authors' ``agg_mode``)."""
    importance_weights: bool = True
    """Multiply W by the squared sequence importance ratio (``use_is_weights``); reads ``rollout_logprobs``."""
    clip: float | None = Field(None, gt=0.0)
    """Cap the sequence ratio at this value first (``use_clipped_is_ratios``); null: no cap."""
    normalize_by_length: bool = False
    """Divide W by L_i^2 (``normalize_by_length``)."""
    normalize_std: bool = False
    """Group scope: divide R_i - b_g by the group's population reward std (``norm_by_std``)."""
    eps: float = Field(1e-8, ge=0.0, le=1.0)
    """Added to sum W in the mean (the authors' 1e-8)."""
    winsor_lower: float = Field(0.05, ge=0.0, le=1.0)
    """``winsorized_mean``: values below this weighted quantile are raised to it (the authors' 0.05)."""
    winsor_upper: float = Field(0.95, ge=0.0, le=1.0)
    """``winsorized_mean``: values above this weighted quantile are lowered to it (the authors' 0.95)."""

    @model_validator(mode="after")
    def _check(self):
        if self.winsor_lower > self.winsor_upper:
            raise ValueError(f"winsor_lower {self.winsor_lower:g} > winsor_upper {self.winsor_upper:g}: need lower <= upper")
        if self.normalize_std and self.scope == "step":
            raise ValueError("normalize_std divides by a group's reward std: it needs scope: group")
        if self.clip is not None and not self.importance_weights:
            raise ValueError("clip caps the importance ratio, which importance_weights: false leaves out")
        return self

    @property
    def reads(self) -> frozenset[str]:  # type: ignore[override]
        base = {"rewards", "group_ids", "grad_sq_norms"}
        return frozenset(base | ({"rollout_logprobs"} if self.importance_weights else set()))

    def sequence_inputs(self, t) -> dict[str, torch.Tensor]:
        """``log_weight``: ``[B]`` float64 log W_i of one micro-batch's responses (before the scope's sums)."""
        norms = t.batch.grad_sq_norms.detach().to(torch.float64)
        negative = (norms < 0) & t.valid_bool.any(-1)  # once per micro-batch of a gather: a squared norm is >= 0
        if bool(negative.any()):
            row = int(negative.nonzero()[0, 0])
            raise BatchError(
                f"advantage (opob): TokenBatch.grad_sq_norms must be squared norms (>= 0); row {row} holds {float(norms[row])!r}"
            )
        log_w = torch.log(norms)
        if self.importance_weights:
            log_ratio = torch.where(t.valid_bool, t.old_logprobs - t.rollout_logprobs, 0.0).to(torch.float64).sum(-1)
            if self.clip is not None:
                log_ratio = log_ratio.clamp(max=math.log(self.clip))
            log_w = log_w + 2.0 * log_ratio
        if self.normalize_by_length:
            log_w = log_w - 2.0 * torch.log(t.valid.sum(-1).clamp(min=1.0).to(torch.float64))
        return {"log_weight": log_w}

    def fit(self, rewards, group_ids, lengths, responses=None, *, log_weight=None):
        table = GroupTable.fit(rewards, group_ids, responses)
        responses = torch.ones_like(rewards, dtype=torch.bool) if responses is None else responses
        weights = torch.where(responses, torch.exp(log_weight.clamp(max=_MAX_LOG_WEIGHT)), 0.0)
        rewards = torch.where(responses, rewards.to(torch.float64), 0.0)
        if self.scope == "step":
            mean, std, _ = table.rows(group_ids, responses)
            values = (rewards - mean.to(torch.float64)) / (std.to(torch.float64) + 1e-6)
            scopes = [responses]
        else:
            inverse = torch.searchsorted(table.keys, group_ids)
            scopes = [(inverse == g) & responses for g in range(table.keys.numel())]
            values = rewards
        baselines, stds, ess = [], [], []
        for rows in scopes:
            v, w = values[rows], weights[rows]
            baselines.append(weighted_baseline(v, w, self.aggregate, self.eps, self.winsor_lower, self.winsor_upper))
            stds.append(v.std(unbiased=False) if v.numel() else v.new_zeros(()))
            ess.append(_ess_fraction(w))
        stack = lambda xs: torch.stack(xs) if xs else torch.zeros(0, dtype=torch.float64)  # noqa: E731 (a step of no group)
        state = OPOBState(table, stack(baselines), stack(stds), stack(ess))
        return replace(state, metrics=self._metrics(state))

    def apply(self, stats: OPOBState, rewards, group_ids, responses=None):
        rewards = rewards.to(torch.float64)
        if self.scope == "step":
            mean, std, _ = stats.table.rows(group_ids, responses)
            values = (rewards - mean.to(torch.float64)) / (std.to(torch.float64) + 1e-6)
            return zero_padding_rows((values - stats.baseline[0]).to(torch.float32), responses)
        index = stats.table.lookup(group_ids, responses).clamp(min=0)
        advantages = rewards - stats.baseline[index]
        if self.normalize_std:
            std = stats.population_std[index]
            advantages = torch.where(std > 1e-8, advantages / std, advantages)
        return zero_padding_rows(advantages.to(torch.float32), responses)

    def step_metrics(self, stats: OPOBState) -> dict[str, float]:
        """Mean over the step's scopes of the baseline, its gap to the plain group mean, and the weights' ESS fraction.

        Scopes without a response (a group of padding rows) are left out: padding changes no metric.
        Computed when the step is fitted: each micro-batch's loss reports them without reading the device.
        """
        return stats.metrics

    def _metrics(self, stats: OPOBState) -> dict[str, float]:
        baseline, ess = stats.baseline, stats.weight_ess
        if self.scope == "group":
            responded = stats.table.count > 0
            baseline, ess = baseline[responded], ess[responded]
        if baseline.numel() == 0:
            return {}
        out = {"baseline": float(baseline.mean()), "weight_ess_fraction": float(ess.mean())}
        if self.scope == "group":
            sized = stats.table.count > 1
            if bool(sized.any()):
                gap = stats.baseline[sized] - stats.table.mean[sized].to(torch.float64)
                out["baseline_minus_mean"] = float(gap.mean())
        return out

    def describe(self) -> str:
        w = "||grad log pi(tau_i)||^2" + (" * w_i^2" if self.importance_weights else "")
        if self.clip is not None:
            w += f" (w_i capped at {self.clip:g})"
        if self.normalize_by_length:
            w += " / L_i^2"
        where = "per prompt group g, of R_i" if self.scope == "group" else "over the step, of GRPO advantages"
        adv = "(R_i - b_g) / pop-std_g R" if self.normalize_std else ("R_i - b_g" if self.scope == "group" else "A_grpo_i - b")
        return f"opob (VCPO): A_i = {adv}, b = weighted {self.aggregate} {where}, W_i = {w}"
