r"""The metrics of one micro-batch's loss, each declared with how it combines over the step's micro-batches.

Names (``<label>``: a component's kind, suffixed with its position when the kind appears twice):

- ``mask/<label>/kept``, ``/silenced`` (sum): the valid tokens the mask keeps and silences (for a
  rollout rejection, over the response tokens before any rejection); ``/silenced_positive``,
  ``/silenced_negative`` (sum): the silenced ones with A > 0 and with A < 0; ``/kept_fraction``
  (token_mean); its step threshold(s) (step), ``/entropy_threshold`` or an expression's
  ``/quantile_...``, a ``random_silence``'s ``/target`` and ``/candidates``.
- ``shadow/<label>/kept``, ``/silenced``, ``/silenced_positive``, ``/silenced_negative`` (sum),
  ``/kept_fraction`` (token_mean), its threshold(s) (step): the same for a shadow mask
  (``shadow_masks``: measured over the valid tokens, not acting).
- ``reweight/<label>/mean`` (token_mean): the factor's mean over kept tokens; the reweighter's
  step values ``reweight/<label>/<name>`` (step); the surrogate's ``surrogate/<name>`` (step).
- ``loss/policy``, ``loss/<regulariser label>`` (the term without its coefficient), ``loss`` (sum).
- ``tokens/valid``, ``tokens/kept`` (sum), ``tokens/kept_fraction`` (token_mean).
- ``step/...`` (step): the step's denominators, dynamic sampling's and VCPO's decisions; the
  estimator's ``advantage/<kind>/<name>`` (step).
- the surrogate's counts as fractions of valid tokens (``clip/high_fraction``), ``approx_kl``
  (``-mean log r``), ``advantage/mean``, ``entropy/mean`` (token_mean).
- for an objective that reads ``rollout_logprobs``, the trainer/inference mismatch over valid tokens,
  with $\ell = \mathrm{clamp}(\log\pi_{train}(old) - \log\pi_{infer}, \pm 20)$: ``mismatch/kl_k1``
  ($-\ell$) and ``mismatch/kl_k3`` ($e^\ell - 1 - \ell$), both estimates of
  $\mathrm{KL}(\pi_{infer}\,\|\,\pi_{train})$ from the sampled tokens (token_mean);
  ``mismatch/ratio_min``, ``mismatch/ratio_max``: $e^\ell$ before any truncation (min, max; 1 in a
  micro-batch without a valid token).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlstab.batch import TokenBatch
from rlstab.compiler.keeps import shadow_keeps
from rlstab.lazy import torch
from rlstab.masks.rollout import SAFETY_BOUND
from rlstab.metrics import STEP_COUNTS, Combines, Element
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.compiler.loss_phase import LossTerms
    from rlstab.compiler.plan import Plan
    from rlstab.compiler.step_stats import StepStats
    from rlstab.objective import Objective


class Reported:
    """Metrics as a loss reports them: names, values (0-d tensors stay on their device, numbers on the
    host, until read) and how each combines over micro-batches.

    ``ratio`` reports a quotient whose division waits for ``finish``: there, the numerators over one
    denominator (of one dtype) are divided at once, one stack and one division for all of a loss's
    fractions of its valid tokens instead of a division each (each quotient the same float)."""

    def __init__(self):
        self.names: list[str] = []
        self.values: list[torch.Tensor | Element | float] = []
        self.kinds: list[Combines] = []
        self._ratios: dict[tuple, tuple[torch.Tensor, list[tuple[int, torch.Tensor]]]] = {}

    def add(self, name: str, value: torch.Tensor | float, combines: Combines) -> None:
        self.names.append(name)
        self.values.append(value)
        self.kinds.append(combines)

    def ratio(self, name: str, numerator: torch.Tensor | float, denominator: torch.Tensor, combines: Combines) -> None:
        """Report ``numerator / denominator`` (a 0-d tensor), divided in ``finish``."""
        if isinstance(numerator, torch.Tensor) and numerator.dim() == 0:
            key = (id(denominator), numerator.dtype, numerator.device)
            self._ratios.setdefault(key, (denominator, []))[1].append((len(self.values), numerator))
        else:
            numerator = numerator / denominator  # now
        self.add(name, numerator, combines)  # replaced by its quotient in finish

    def finish(self) -> Reported:
        """Divide the ratios, each group of numerators over one denominator at once."""
        for denominator, slots in self._ratios.values():
            if len(slots) == 1:
                (i, numerator), = slots
                self.values[i] = numerator / denominator
                continue
            quotients = torch.stack([numerator for _, numerator in slots]) / denominator
            for j, (i, _) in enumerate(slots):
                self.values[i] = Element(quotients, j)
        self._ratios = {}
        return self


def loss_metrics(
    objective: Objective, plan: Plan, batch: TokenBatch, t: Tokens, step: StepStats, keeps: list[torch.Tensor],
    terms: LossTerms,
) -> Reported:
    """The metrics of one micro-batch (its ``keeps`` per mask and loss ``terms``), ``loss`` last."""
    obj = objective
    out = Reported()
    n_valid = t.valid_count()
    n_valid_safe = n_valid.clamp(min=1.0)
    valid_flat = t.valid.reshape(-1)
    _mask_metrics(out, objective, plan, batch, t, valid_flat, n_valid, n_valid_safe, step, keeps, terms.n_kept)
    if obj.reweighters:
        n_kept_safe = terms.n_kept.clamp(min=1.0)
    for label, reweighter, value, reweighted in zip(plan.reweighter_labels, obj.reweighters, step.hooks, terms.reweighted):
        out.ratio(f"reweight/{label}/mean", reweighted, n_kept_safe, "token_mean")
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
    out.ratio("tokens/kept_fraction", terms.n_kept, n_valid_safe, "token_mean")
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
        out.ratio(name, count, n_valid_safe, "token_mean")
    out.ratio("approx_kl", -torch.dot(valid_flat, t.log_ratio.reshape(-1)), n_valid_safe, "token_mean")
    adv = t.advantage_per_response  # [B]: sum over rows of valid tokens x advantage, without a [B, T] copy
    if adv is not None:
        adv_sum = torch.dot(t.valid_rows(), adv)
    else:
        adv_sum = torch.dot(valid_flat, t.advantage_rows.reshape(-1))
    out.ratio("advantage/mean", adv_sum, n_valid_safe, "token_mean")
    if t.entropy is not None:
        out.ratio("entropy/mean", torch.dot(valid_flat, t.entropy.reshape(-1)), n_valid_safe, "token_mean")
    if plan.readers("rollout_logprobs"):
        _mismatch_metrics(out, t, valid_flat, n_valid_safe)
    # Without regularisers the loss's value is the policy term's (the same float): reported from the tensor
    # without a gradient, which the metrics need not detach.
    out.add("loss", terms.loss if terms.regularisers else terms.policy, "sum")
    return out.finish()


def _mask_metrics(
    out: Reported, objective: Objective, plan: Plan, batch: TokenBatch, t: Tokens, valid_flat: torch.Tensor,
    n_valid: torch.Tensor, n_valid_safe: torch.Tensor, step: StepStats, keeps: list[torch.Tensor],
    n_kept: torch.Tensor,
) -> None:
    """Each mask's (then each shadow mask's) kept and silenced tokens, their fraction, and its step threshold(s).

    ``n_kept``: the tokens every mask keeps, which is what the one mask of an objective without a rollout
    rejection keeps (a count: the same number whichever way it is summed)."""
    if plan.rejections:  # their counts are over the tokens before any rejection
        before = step.step_level.response_tokens(batch)
        before_rows = before.sum(-1)
        n_before = before_rows.sum()
        n_before_safe = n_before.clamp(min=1.0)
    only_mask = len(keeps) == 1 and not plan.rejections
    signs = _advantage_signs(t) if keeps or objective.shadow_masks else None
    for i, (label, mask, k, thr) in enumerate(zip(plan.mask_labels, objective.masks, keeps, step.thresholds)):
        base, base_rows, n_base, n_base_safe = (
            (before, before_rows, n_before, n_before_safe) if i in plan.rejections
            else (t.valid, t.valid_rows(), n_valid, n_valid_safe)
        )
        n_kept_by_mask = n_kept if only_mask else torch.dot(base.reshape(-1), k.reshape(-1))
        out.add(f"mask/{label}/kept", n_kept_by_mask, "sum")
        out.add(f"mask/{label}/silenced", n_base - n_kept_by_mask, "sum")
        _silenced_signs(out, f"mask/{label}", base, base_rows, k, signs)
        out.ratio(f"mask/{label}/kept_fraction", n_kept_by_mask, n_base_safe, "token_mean")
        _threshold_metrics(out, f"mask/{label}", mask, thr)
    shadows = shadow_keeps(objective, t, step.thresholds)
    for label, mask, k, thr in zip(plan.shadow_labels, objective.shadow_masks, shadows, step.thresholds[len(keeps):]):
        n_kept_by_mask = torch.dot(valid_flat, k.reshape(-1))
        out.add(f"{label}/kept", n_kept_by_mask, "sum")
        out.add(f"{label}/silenced", n_valid - n_kept_by_mask, "sum")
        _silenced_signs(out, label, t.valid, t.valid_rows(), k, signs)
        out.ratio(f"{label}/kept_fraction", n_kept_by_mask, n_valid_safe, "token_mean")
        _threshold_metrics(out, label, mask, thr)


def _advantage_signs(t: Tokens) -> torch.Tensor | None:
    """``[2, B]`` float indicators of A > 0 and A < 0 per response (``[2, B, T]`` for per-token advantages);
    None without advantages."""
    if t.advantages is None:
        return None
    adv = t.advantages if t.advantage_per_response is None else t.advantage_per_response
    return torch.stack([adv > 0, adv < 0]).to(torch.float32)


def _silenced_signs(
    out: Reported, prefix: str, base: torch.Tensor, base_rows: torch.Tensor, keep: torch.Tensor, signs: torch.Tensor | None,
) -> None:
    """``<prefix>/silenced_positive`` and ``/silenced_negative``: the tokens of ``base`` (``[B, T]``, ``base_rows`` its
    row sums) that ``keep`` silences, by A's sign. Per-response advantages need each row's kept count only: one
    pass over ``[B, T]``."""
    if signs is None:
        return
    if signs.dim() == 2:
        counts = signs @ (base_rows - torch.linalg.vecdot(base, keep))
    else:
        counts = (signs * (base - base * keep)).sum((1, 2))
    out.add(f"{prefix}/silenced_positive", Element(counts, 0), "sum")
    out.add(f"{prefix}/silenced_negative", Element(counts, 1), "sum")


def _mismatch_metrics(out: Reported, t: Tokens, valid_flat: torch.Tensor, n_valid_safe: torch.Tensor) -> None:
    """The trainer/inference mismatch over the valid tokens (see the module's docstring)."""
    log_ratio = torch.where(t.valid_bool, t.old_logprobs - t.rollout_logprobs, 0.0).clamp_(-SAFETY_BOUND, SAFETY_BOUND)
    flat = log_ratio.reshape(-1)
    k1 = torch.dot(valid_flat, flat)
    out.ratio("mismatch/kl_k1", -k1, n_valid_safe, "token_mean")
    # sum of r - 1 - log r as sum expm1(log r) - sum log r (expm1 keeps r - 1 accurate near r = 1); padding adds 0
    out.ratio("mismatch/kl_k3", torch.dot(valid_flat, torch.expm1(flat)) - k1, n_valid_safe, "token_mean")
    for name, extreme, identity in (("mismatch/ratio_min", torch.amin, math.inf), ("mismatch/ratio_max", torch.amax, -math.inf)):
        if log_ratio.numel():  # a shape, known on the host
            value = extreme(torch.where(t.valid_bool, log_ratio, identity))
            value = torch.where(value == identity, 0.0, value).exp()  # no valid token: 1 (log r is within +-20)
        else:
            value = 1.0
        out.add(name, value, "min" if extreme is torch.amin else "max")


def _threshold_metrics(out: Reported, prefix: str, mask, thr) -> None:
    """A mask's step threshold(s) (step), named by the mask; a tuple's entries named None are not reported."""
    if isinstance(thr, tuple):  # several step values, named by the mask
        for name, value in zip(mask.threshold_names, thr):
            if value is not None and name is not None:
                out.add(f"{prefix}/{name}", value, "step")
    elif thr is not None:
        out.add(f"{prefix}/{mask.threshold_name}", thr, "step")
