"""KL penalty to an anchor policy: the reference model, the old policy or the inference engine's."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.regularisers.base import Regulariser

_ANCHOR_FIELD = {"reference": "ref_logprobs", "old": "old_logprobs", "rollout": "rollout_logprobs"}
_ANCHOR_SYMBOL = {"reference": "ref_logp", "old": "old_logp", "rollout": "rollout_logp"}


class KLPenalty(Regulariser):
    r"""KL to an anchor policy, added as $c \cdot \mathrm{Agg}(k)$ with a per-token estimator k.

    With $\delta = \log\pi_\theta - \log\pi_{anchor}$ (Schulman, "Approximating KL divergence", 2020):

    - ``k1``: $k = \delta$ (unbiased, high variance, can be negative);
    - ``k2``: $k = \tfrac12 \delta^2$;
    - ``k3``: $k = e^{-\delta} + \delta - 1$, clamped to [-10, 10] after clamping $-\delta$ to
      [-20, 20] (veRL's ``low_var_kl``; the estimator of GRPO's KL term in DeepSeekMath, arXiv 2402.03300);
    - ``squared``: $k = \delta^2$, k2 without its half: Kimi K2.5's $\tau(\log\pi_\theta/\pi_{old})^2$
      (arXiv 2602.02276, eq. 1) and prime-rl's ``kl_tau * log_importance_ratio**2``
      (``src/prime_rl/trainer/rl/loss.py``, ``default_loss_fn`` and ``ipo_loss_fn``), where ``coef`` is $\tau$.

    ``anchor``: which policy $\pi_{anchor}$ is.

    - ``reference`` (default): the frozen reference model, ``TokenBatch.ref_logprobs`` (GRPO's KL term;
      veRL's ``use_kl_loss``).
    - ``old``: the policy that the ratio is taken against, ``TokenBatch.old_logprobs`` (the current
      policy on-policy, where the term is 0). In bypass mode, where the trainer passes the inference
      engine's log-probabilities as ``old_logprobs`` (veRL's ``bypass_mode``; prime-rl has no old-policy
      pass), this anchors at the sampler, as Kimi K2.5 and prime-rl's IPO do.
    - ``rollout``: the inference engine's log-probabilities, ``TokenBatch.rollout_logprobs``, for a trainer
      that recomputes the old policy and carries the sampler's separately (decoupled mode).

    The anchor is a constant (no gradient flows into it); the gradient is the estimator's through
    $\log\pi_\theta$. Default ``coef = 0.001`` and ``k3`` at the reference (veRL's ``kl_loss_coef`` and
    ``low_var_kl``).
    """

    kind: Literal["kl"] = "kl"
    coef: float = Field(0.001, ge=0.0, le=10.0)
    """KL coefficient."""
    estimator: Literal["k1", "k2", "k3", "squared"] = "k3"
    """Per-token KL estimator (``squared``: delta^2, Kimi K2.5's, no half)."""
    anchor: Literal["reference", "old", "rollout"] = "reference"
    """The policy the KL is taken to: the reference model, the old policy, or the inference engine's."""

    _later_fields: ClassVar[tuple[str, ...]] = ("tokens", "average", "anchor")

    @property
    def reads(self) -> frozenset[str]:  # depends on the anchor
        field = _ANCHOR_FIELD[self.anchor]
        return frozenset() if field == "old_logprobs" else frozenset({field})

    @property
    def added_by_trainers(self) -> bool:  # the trainers' KL losses anchor at the reference model only
        return self.anchor == "reference"

    def term(self, batch, t):
        # 0 on padding, before any square: huge finite padding would overflow (and inf * 0 is NaN, in the gradient too)
        delta = torch.where(t.valid_bool, batch.logprobs.to(torch.float32) - getattr(t, _ANCHOR_FIELD[self.anchor]), 0.0)
        if self.estimator == "k1":
            return delta
        if self.estimator == "k2":
            return 0.5 * delta.square()
        if self.estimator == "squared":
            return delta.square()
        neg = (-delta).clamp(-20.0, 20.0)
        return (neg.exp() - neg - 1.0).clamp(-10.0, 10.0)

    def describe(self) -> str:
        return f"kl: + {self.coef:g} * Agg({self.estimator}(logp - {_ANCHOR_SYMBOL[self.anchor]})){self._on_tokens()}"
