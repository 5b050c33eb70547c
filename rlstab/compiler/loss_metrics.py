"""The metrics of one micro-batch's loss, each declared with how it combines over the step's micro-batches.

Names (``<label>``: a component's kind, suffixed with its position when the kind appears twice):

- ``mask/<label>/kept``, ``/silenced`` (sum): the valid tokens the mask keeps and silences (for a
  rollout rejection, over the response tokens before any rejection); ``/kept_fraction``
  (token_mean); its step threshold(s) (step), ``/entropy_threshold`` or an expression's
  ``/quantile_...``, a ``random_silence``'s ``/target`` and ``/candidates``.
- ``shadow/<label>/kept``, ``/silenced`` (sum), ``/kept_fraction`` (token_mean), its threshold(s)
  (step): the same for a shadow mask (``shadow_masks``: measured over the valid tokens, not acting).
- ``reweight/<label>/mean`` (token_mean): the factor's mean over kept tokens; the reweighter's
  step values ``reweight/<label>/<name>`` (step); the surrogate's ``surrogate/<name>`` (step).
- ``loss/policy``, ``loss/<regulariser label>`` (the term without its coefficient), ``loss`` (sum).
- ``tokens/valid``, ``tokens/kept`` (sum), ``tokens/kept_fraction`` (token_mean).
- ``step/...`` (step): the step's denominators, dynamic sampling's and VCPO's decisions; the
  estimator's ``advantage/<kind>/<name>`` (step).
- the surrogate's counts as fractions of valid tokens (``clip/high_fraction``), ``approx_kl``
  (``-mean log r``), ``advantage/mean``, ``entropy/mean`` (token_mean).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.batch import TokenBatch
from rlstab.compiler.inputs import shadow_keeps
from rlstab.lazy import torch
from rlstab.metrics import Combines
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.compiler.loss_phase import LossTerms
    from rlstab.compiler.plan import Plan
    from rlstab.compiler.step_stats import StepStats
    from rlstab.objective import Objective


STEP_COUNTS = ("step/tokens_valid", "step/tokens_kept", "step/branch_tokens_valid", "step/branch_responses")
"""The step's denominators (step): the same in each micro-batch of an optimizer step, and a count of it, so
that over several optimizer steps (a trainer's updates of one rollout batch) they add up."""


class Reported:
    """Metrics as a loss reports them: names, values (0-d tensors stay on their device, numbers on the
    host, until read) and how each combines over micro-batches."""

    def __init__(self):
        self.names: list[str] = []
        self.values: list[torch.Tensor | float] = []
        self.kinds: list[Combines] = []

    def add(self, name: str, value: torch.Tensor | float, combines: Combines) -> None:
        self.names.append(name)
        self.values.append(value)
        self.kinds.append(combines)


def loss_metrics(
    objective: Objective, plan: Plan, batch: TokenBatch, t: Tokens, step: StepStats, keeps: list[torch.Tensor],
    terms: LossTerms,
) -> Reported:
    """The metrics of one micro-batch (its ``keeps`` per mask and loss ``terms``), ``loss`` last."""
    obj = objective
    out = Reported()
    n_valid = t.valid.sum()
    n_valid_safe = n_valid.clamp(min=1.0)
    valid_flat = t.valid.reshape(-1)
    _mask_metrics(out, objective, plan, batch, t, valid_flat, n_valid, step, keeps)
    for label, reweighter, value, reweighted in zip(plan.reweighter_labels, obj.reweighters, step.hooks, terms.reweighted):
        out.add(f"reweight/{label}/mean", reweighted / terms.n_kept.clamp(min=1.0), "token_mean")
        for name, v in reweighter.step_metrics(value).items():
            out.add(f"reweight/{label}/{name}", v, "step")
    for name, v in obj.surrogate.step_metrics(step.hooks[len(obj.reweighters)]).items():
        out.add(f"surrogate/{name}", v, "step")
    for label, reg, value in zip(plan.regulariser_labels, obj.regularisers, step.hooks[len(obj.reweighters) + 1:]):
        for name, v in reg.step_metrics(value).items():
            out.add(f"regulariser/{label}/{name}", v, "step")
    out.add("loss/policy", terms.policy, "sum")
    for label, value in zip(plan.regulariser_labels, terms.regularisers):
        out.add(f"loss/{label}", value, "sum")

    out.add("tokens/valid", n_valid, "sum")
    out.add("tokens/kept", terms.n_kept, "sum")
    out.add("tokens/kept_fraction", terms.n_kept / n_valid_safe, "token_mean")
    tokens_valid, tokens_kept, branch_tokens_valid, branch_responses = STEP_COUNTS
    out.add(tokens_valid, step.counts.tokens_valid, "step")
    out.add(tokens_kept, step.counts.tokens_kept, "step")
    if step.branch_counts is not None:
        out.add(branch_tokens_valid, step.branch_counts.tokens_valid, "step")
        out.add(branch_responses, step.branch_counts.sequences_valid, "step")
    for name, value in step.step_level.metrics(obj).items():
        out.add(name, value, "step")
    if step.advantage is not None:
        for name, value in obj.advantage.step_metrics(step.advantage).items():
            out.add(f"advantage/{obj.advantage.kind}/{name}", value, "step")
    for name, count in terms.surrogate_counts.items():
        out.add(name, count / n_valid_safe, "token_mean")
    out.add("approx_kl", -torch.dot(valid_flat, t.log_ratio.reshape(-1)) / n_valid_safe, "token_mean")
    adv = t.advantage_rows  # [B, 1]: sum over rows of valid tokens x advantage, without a [B, T] copy
    adv_sum = torch.dot(t.valid.sum(-1), adv[:, 0]) if adv.shape[-1] == 1 else torch.dot(valid_flat, adv.reshape(-1))
    out.add("advantage/mean", adv_sum / n_valid_safe, "token_mean")
    if t.entropy is not None:
        out.add("entropy/mean", torch.dot(valid_flat, t.entropy.reshape(-1)) / n_valid_safe, "token_mean")
    out.add("loss", terms.loss, "sum")
    return out


def _mask_metrics(
    out: Reported, objective: Objective, plan: Plan, batch: TokenBatch, t: Tokens, valid_flat: torch.Tensor,
    n_valid: torch.Tensor, step: StepStats, keeps: list[torch.Tensor],
) -> None:
    """Each mask's (then each shadow mask's) kept and silenced tokens, their fraction, and its step threshold(s)."""
    if plan.rejections:  # their counts are over the tokens before any rejection
        before_flat = step.step_level.response_tokens(batch).reshape(-1)
        n_before = before_flat.sum()
    for i, (label, mask, k, thr) in enumerate(zip(plan.mask_labels, objective.masks, keeps, step.thresholds)):
        base, n_base = (before_flat, n_before) if i in plan.rejections else (valid_flat, n_valid)
        n_kept_by_mask = torch.dot(base, k.reshape(-1))
        out.add(f"mask/{label}/kept", n_kept_by_mask, "sum")
        out.add(f"mask/{label}/silenced", n_base - n_kept_by_mask, "sum")
        out.add(f"mask/{label}/kept_fraction", n_kept_by_mask / n_base.clamp(min=1.0), "token_mean")
        _threshold_metrics(out, f"mask/{label}", mask, thr)
    shadows = shadow_keeps(objective, t, step.thresholds)
    for label, mask, k, thr in zip(plan.shadow_labels, objective.shadow_masks, shadows, step.thresholds[len(keeps):]):
        n_kept_by_mask = torch.dot(valid_flat, k.reshape(-1))
        out.add(f"{label}/kept", n_kept_by_mask, "sum")
        out.add(f"{label}/silenced", n_valid - n_kept_by_mask, "sum")
        out.add(f"{label}/kept_fraction", n_kept_by_mask / n_valid.clamp(min=1.0), "token_mean")
        _threshold_metrics(out, label, mask, thr)


def _threshold_metrics(out: Reported, prefix: str, mask, thr) -> None:
    """A mask's step threshold(s) (step), named by the mask; a tuple's entries named None are not reported."""
    if isinstance(thr, tuple):  # several step values, named by the mask
        for name, value in zip(mask.threshold_names, thr):
            if value is not None and name is not None:
                out.add(f"{prefix}/{name}", value, "step")
    elif thr is not None:
        out.add(f"{prefix}/{mask.threshold_name}", thr, "step")
