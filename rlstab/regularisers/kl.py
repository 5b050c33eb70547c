"""KL penalty to a reference policy."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.regularisers.base import Regulariser


class KLPenalty(Regulariser):
    r"""KL to the reference policy, added as $c \cdot \mathrm{Agg}(k)$ with a per-token estimator k.

    With $\delta = \log\pi - \log\pi_{ref}$ (Schulman, "Approximating KL divergence", 2020):

    - ``k1``: $k = \delta$ (unbiased, high variance, can be negative);
    - ``k2``: $k = \tfrac12 \delta^2$;
    - ``k3``: $k = e^{-\delta} + \delta - 1$, clamped to [-10, 10] after clamping $-\delta$ to
      [-20, 20] (veRL's ``low_var_kl``; the estimator of GRPO's KL term in DeepSeekMath, arXiv 2402.03300).

    Default ``coef = 0.001`` and ``k3`` (veRL's ``kl_loss_coef`` and ``low_var_kl``).
    """

    kind: Literal["kl"] = "kl"
    coef: float = Field(0.001, ge=0.0, le=10.0)
    """KL coefficient."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator."""

    reads: ClassVar[frozenset[str]] = frozenset({"ref_logprobs"})

    def term(self, batch, t):
        delta = batch.logprobs.to(torch.float32) - t.ref_logprobs
        if self.estimator == "k1":
            return delta
        if self.estimator == "k2":
            return 0.5 * delta.square()
        neg = (-delta).clamp(-20.0, 20.0)
        return (neg.exp() - neg - 1.0).clamp(-10.0, 10.0)

    def describe(self) -> str:
        return f"kl: + {self.coef:g} * Agg({self.estimator}(logp - ref_logp))"
