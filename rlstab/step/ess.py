"""VCPO's learning-rate scale from the effective sample size of the step's sequence importance weights."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.step.base import LearningRateScale


def effective_sample_size(log_weights: torch.Tensor) -> float:
    """``(sum w)^2 / sum w^2`` of ``w = exp(log_weights)``, in float64 and shifted by the max (never overflows)."""
    if log_weights.numel() == 0:
        return 0.0
    lw = log_weights.detach().to(torch.float64)
    lw = lw - lw.max()
    return float(torch.exp(lw).sum() ** 2 / torch.exp(2.0 * lw).sum())  # host sync: the optimizer's learning rate is a number


def ess_lr_scale(log_weights: torch.Tensor, rule: str = "sqrt", base_ratio: float = 1.0) -> tuple[float, float]:
    """``(scale, ESS)``: ``scale = min(1, ESS / B / base_ratio)``, square-rooted for ``rule="sqrt"``.

    ``log_weights``: ``[B]`` log sequence importance weights of the step's responses. With no
    response the scale is 1 (nothing trains).
    """
    n = log_weights.numel()
    ess = effective_sample_size(log_weights)
    if n == 0:
        return 1.0, 0.0
    scale = min(1.0, ess / n / base_ratio)
    return (math.sqrt(scale) if rule == "sqrt" else scale), ess


class ESSLearningRateScale(LearningRateScale):
    r"""VCPO's learning-rate factor: $\eta \leftarrow \eta\,\sqrt{\min(1, \mathrm{ESS}/B)}$.

    $$w_i = \exp\Bigl(\sum_t \log\pi_{\theta}(y_{i,t}) - \log\pi_{infer}(y_{i,t})\Bigr),\qquad
      \mathrm{ESS} = \frac{(\sum_i w_i)^2}{\sum_i w_i^2},\qquad
      s = \Bigl(\min\bigl(1, \tfrac{\mathrm{ESS}}{B\,\rho}\bigr)\Bigr)^{1/2}$$

    "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (VCPO, arXiv 2602.17616; the
    authors' code github mit-han-lab/vcpo: ``compute_ess_info`` and ``ess_scaling`` in
    ``megatron_actor.py``): stale rollouts give heavy-tailed sequence importance weights, and a
    collapsing ESS predicts collapse; scaling the step size by the ESS fraction damps those updates.
    The sums run over the whole step (every micro-batch and rank) and over the B responses that have
    valid tokens (after rollout rejection and dynamic sampling), each weight summing its response's
    valid tokens. Defaults as the authors' scripts: ``rule: sqrt``, ``base_ratio`` $\rho = 1$, unclipped
    weights (``clip: null``; their ``use_clipped`` caps $w$ at the IS threshold). The weights are
    $\pi_{train}(\theta_{old})/\pi_{infer}$ (the authors' ``old_log_prob - rollout_log_prob``;
    ``numerator: current`` uses the batch's ``logprobs``, which ``gather`` receives from the current
    policy). ESS is computed exactly in float64 (shifted by the largest log-weight) where the
    authors add 1e-8 to the denominator; with no response the scale is 1.

    The factor is not applied by the loss: ``gather`` returns it as ``StepStats.lr_scale`` and the
    trainer multiplies its learning rate for this step's optimizer step. VCPO's other part, the
    minimum-variance off-policy baseline, is the advantage estimator
    [`OffPolicyOptimalBaseline`][rlstab.advantages.OffPolicyOptimalBaseline] (``advantage: {kind: opob}``);
    the ``vcpo`` preset composes both.
    """

    kind: Literal["ess"] = "ess"
    numerator: Literal["old", "current"] = "old"
    """Whose log-probabilities the weights' numerator takes: ``old_logprobs`` (VCPO) or ``logprobs``."""
    clip: float | None = Field(None, gt=0.0)
    """Cap each sequence weight at this value before the ESS (VCPO's ``use_clipped``); null: no cap."""
    rule: Literal["sqrt", "linear"] = "sqrt"
    """The factor: sqrt(min(1, ESS / B / base_ratio)), or the min itself."""
    base_ratio: float = Field(1.0, gt=0.0, le=1.0)
    """rho: the ESS fraction at and above which the learning rate is not reduced."""

    reads: ClassVar[frozenset[str]] = frozenset({"rollout_logprobs"})

    def log_weights(self, t) -> torch.Tensor:
        """``[B]`` log sequence weights of one micro-batch's responses with valid tokens."""
        numerator = t.old_logprobs if self.numerator == "old" else t.logprobs
        log_ratio = torch.where(t.valid_bool, numerator - t.rollout_logprobs, 0.0)
        lw = log_ratio.to(torch.float64).sum(-1)
        if self.clip is not None:
            lw = lw.clamp(max=math.log(self.clip))
        return lw[t.valid_bool.any(-1)]

    def scale(self, log_weights: torch.Tensor) -> tuple[float, float]:
        """``(factor, ESS)`` of the step's log sequence weights."""
        return ess_lr_scale(log_weights, self.rule, self.base_ratio)

    def describe(self) -> str:
        num = "pi_old" if self.numerator == "old" else "pi"
        cap = f", capped at {self.clip:g}" if self.clip is not None else ""
        root = "sqrt(" if self.rule == "sqrt" else "("
        return (
            f"ess: lr factor {root}min(1, ESS / B / {self.base_ratio:g})), ESS = (sum w)^2 / sum w^2 over the step's "
            f"responses, w = prod_t {num}/pi_infer{cap}; returned as StepStats.lr_scale for the trainer"
        )
