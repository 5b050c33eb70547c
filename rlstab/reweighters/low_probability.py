"""Low-probability advantage reweighting (AR)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.reweighters.base import Reweighter


class LowProbabilityReweight(Reweighter):
    r"""Scale each token's advantage by $\alpha\,\pi_{old}(y_t) + 1 - \alpha$.

    $$A'_{i,t} = \left(\alpha\,\pi_{\theta_{old}}(y_t) + 1 - \alpha\right) A_{i,t}$$

    "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs" (arXiv 2505.12929),
    Advantage Reweighting: low-probability tokens have large gradient norms and crowd out the
    updates of high-probability ones; down-weighting them by up to ``1 - alpha`` rebalances.
    ``alpha = 0.3`` is the paper's default. ``prob_source``: the paper uses the old (sampling)
    policy's probability, so the factor is fixed over a step's updates.
    """

    kind: Literal["low_probability_reweight"] = "low_probability_reweight"
    alpha: float = Field(0.3, ge=0.0, le=1.0)
    """Strength: 0 leaves advantages unchanged, 1 makes the factor the probability itself."""
    prob_source: Literal["old", "current"] = "old"
    """Whose probability sets the factor."""

    def weights(self, t, step) -> torch.Tensor:
        logp = t.old_logprobs if self.prob_source == "old" else t.logprobs
        # clamp: padding may hold any value, and a probability above 1 is never meant
        return torch.exp(logp.clamp(max=0.0)).mul_(self.alpha).add_(1.0 - self.alpha)

    def describe(self) -> str:
        p = "p_old" if self.prob_source == "old" else "p"
        return f"low_probability_reweight: w = {self.alpha:g} * {p} + {1 - self.alpha:g}"
