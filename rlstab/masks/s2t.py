"""S2T, the spurious-token mask of STAPO, and its two ablations."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.masks.base import Mask, at_least, below, positive
from rlstab.quantile import INTERPOLATIONS
from rlstab.tokens import Tokens

Interpolation = Literal["linear", "lower", "higher", "nearest", "midpoint"]
assert set(Interpolation.__args__) == set(INTERPOLATIONS)


def _probability_source(t: Tokens, source: str) -> torch.Tensor:
    return t.logprobs if source == "current" else t.old_logprobs


class S2T(Mask):
    r"""Silence spurious tokens (STAPO, arXiv 2602.15620, the S2T mask).

    A token t of response i is silenced iff all three hold:

    $$A_i > 0 \quad\wedge\quad \pi(y_t) < \tau_p \quad\wedge\quad H_t < \tau_h,$$

    with $\tau_h = Q_q(H)$ the q-quantile of the step's token entropies. Such tokens are rare
    (about 1e-4 of tokens) but their gradients dominate the update: a positive advantage on a
    token the policy found both unlikely and certain. STAPO then divides the clipped surrogate by
    the number of *kept* tokens (set that in the aggregation).

    Defaults, from the paper: ``tau_p = 0.002`` (an absolute probability), ``entropy_quantile = 0.8``
    ("entropy below the 80th percentile" — the complement of the 20-Entropy set).

    Ambiguities made explicit:

    - ``population``: the paper does not say whether the quantile runs over every valid token of
      the step or only positive-advantage ones; default ``valid`` (the natural reading of "the
      step's token entropies", and the 20-Entropy convention).
    - the scope of "the step": the paper does not say whether the quantile runs over a
      micro-batch, an optimizer step or the whole rollout batch. rlstab's choice is the optimizer
      step (every micro-batch and data-parallel rank, from the current policy), the only reading
      that does not change with the micro-batch size or the number of GPUs; the veRL and
      OpenRLHF adapters' ``step_statistics: local`` gives the per-micro-batch reading.
    - ``prob_source``: the paper writes the current policy $\pi_\theta$; on-policy the old policy
      gives the same values. Default ``current``.
    - ``entropy_side: high`` gives the paper's ablation that silences *high*-entropy
      low-probability tokens instead ($H_t \ge \tau_h$); it collapses small models.
    """

    kind: Literal["s2t"] = "s2t"
    tau_p: float = Field(0.002, gt=0.0, lt=1.0)
    """Probability threshold: a token is a candidate when its probability is below this."""
    entropy_quantile: float = Field(0.8, gt=0.0, lt=1.0)
    """q of the entropy threshold tau_h = Q_q(H) over the step's population."""
    population: Literal["valid", "positive"] = "valid"
    """Tokens whose entropies define the quantile: every valid token of the step, or only those with A > 0."""
    prob_source: Literal["current", "old"] = "current"
    """Whose probability is compared with tau_p: the current policy's or the old (sampling) policy's."""
    entropy_side: Literal["low", "high"] = "low"
    """``low``: silence H < tau_h (S2T). ``high``: silence H >= tau_h (the paper's ablation)."""
    interpolation: Interpolation = "linear"
    """How the quantile interpolates between order statistics (as ``torch.quantile``)."""

    reads: ClassVar[frozenset[str]] = frozenset({"entropy"})
    threshold_name: ClassVar[str] = "entropy_threshold"

    def quantile_request(self, t: Tokens):
        include = t.valid_bool if self.population == "valid" else t.valid_bool & (t.advantages > 0)
        return t.entropy, include, self.entropy_quantile

    def keep(self, t: Tokens, threshold: torch.Tensor | None) -> torch.Tensor:
        if threshold is None:  # empty population: no token is silenced
            return torch.ones_like(t.logprobs)
        candidate = below(_probability_source(t, self.prob_source), math.log(self.tau_p))
        candidate.mul_(positive(t.advantage_rows))
        side = below if self.entropy_side == "low" else at_least
        candidate.mul_(side(t.entropy, threshold))
        return torch.rsub(candidate, 1.0)  # 1 - candidate in one operation

    def describe(self) -> str:
        p = "p" if self.prob_source == "current" else "p_old"
        op = "<" if self.entropy_side == "low" else ">="
        pop = "valid tokens" if self.population == "valid" else "valid tokens with A > 0"
        return (
            f"s2t: silence iff A > 0 and {p} < {self.tau_p:g} and H {op} Q_{self.entropy_quantile:g}(H over the "
            f"step's {pop}, {self.interpolation})"
        )


class LowProbability(Mask):
    r"""Silence positive-advantage low-probability tokens, whatever their entropy.

    $$\text{silence iff } A_i > 0 \wedge \pi(y_t) < \tau_p$$

    The probability-only ablation of STAPO (arXiv 2602.15620), which the paper reports does
    *worse* than the unmasked baseline: the entropy condition is what singles out spurious
    tokens. Default ``tau_p = 0.002`` as S2T.
    """

    kind: Literal["low_probability"] = "low_probability"
    tau_p: float = Field(0.002, gt=0.0, lt=1.0)
    """Probability threshold."""
    prob_source: Literal["current", "old"] = "current"
    """Whose probability is compared with tau_p."""

    def keep(self, t: Tokens, threshold: torch.Tensor | None) -> torch.Tensor:
        candidate = below(_probability_source(t, self.prob_source), math.log(self.tau_p))
        candidate.mul_(positive(t.advantage_rows))
        return candidate.neg_().add_(1.0)

    def describe(self) -> str:
        p = "p" if self.prob_source == "current" else "p_old"
        return f"low_probability: silence iff A > 0 and {p} < {self.tau_p:g}"
