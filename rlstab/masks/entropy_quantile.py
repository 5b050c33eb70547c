"""Keep only the highest- (or lowest-) entropy tokens of the step: 20-Entropy."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.masks.base import Mask, at_least, below
from rlstab.masks.s2t import Interpolation
from rlstab.tokens import Tokens


class EntropyQuantile(Mask):
    r"""Train only the top-rho (or bottom-rho) fraction of tokens by entropy.

    ``side: top`` (20-Entropy, "Beyond the 80/20 Rule", arXiv 2506.01939, its objective with the
    indicator $\mathbb{I}[H_t \ge \tau_\rho]$):

    $$\text{keep iff } H_t \ge Q_{1-\rho}(H)$$

    ``side: bottom``: keep iff $H_t < Q_{\rho}(H)$, the exact complement of ``top`` with
    ``1 - rho``.

    The quantile runs over every valid token of the step (the paper's batch $\mathcal{B}$). The
    paper divides by the number of *all* valid tokens (the $1/\sum_i |o_i|$ of its objective), as
    TRL's ``top_entropy_quantile`` does; set that in the aggregation (``count: valid``).
    Default ``rho = 0.2`` from the paper.
    """

    kind: Literal["entropy_quantile"] = "entropy_quantile"
    rho: float = Field(0.2, gt=0.0, le=1.0)
    """Fraction of the step's tokens kept."""
    side: Literal["top", "bottom"] = "top"
    """``top`` keeps the highest-entropy tokens, ``bottom`` the lowest."""
    interpolation: Interpolation = "linear"
    """How the quantile interpolates between order statistics (as ``torch.quantile``)."""

    reads: ClassVar[frozenset[str]] = frozenset({"entropy"})
    threshold_name: ClassVar[str] = "entropy_threshold"

    def quantile_request(self, t: Tokens):
        q = 1.0 - self.rho if self.side == "top" else self.rho
        return t.entropy, t.valid_bool, q

    def keep(self, t: Tokens, threshold: torch.Tensor | None) -> torch.Tensor:
        if threshold is None:
            return torch.ones_like(t.logprobs)
        if self.side == "top":
            return at_least(t.entropy, threshold)
        return below(t.entropy, threshold)

    def describe(self) -> str:
        if self.side == "top":
            rule = f"H >= Q_{1 - self.rho:g}(H)"
        else:
            rule = f"H < Q_{self.rho:g}(H)"
        return f"entropy_quantile: keep iff {rule} over the step's valid tokens ({self.interpolation}); keeps {self.rho:g}"
