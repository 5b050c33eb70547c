"""REINFORCE++: batch-whitened returns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.batch import BatchError
from rlstab.deferred import require
from rlstab.lazy import torch


def whitening_stats(x: torch.Tensor, lengths: torch.Tensor, responses: torch.Tensor | None = None):
    """``(mean, var)`` of per-response values ``x`` over every valid token: each response weighs its length.

    ``mean = sum L x / N``, ``var = sum L (x - mean)^2 / (N - 1)``, ``N = sum L``: veRL's ``masked_whiten``
    of a value broadcast over the response's tokens (unbiased variance). Padding rows (``responses``
    False) are left out whatever ``x`` holds there (0 * NaN is NaN, so they are replaced first).

    The sums run in float64 and ``var`` stays float64 (``mean`` is float32): in float32 a value of
    1.9e19 or more squares past the range, and an infinite variance would whiten every advantage to 0.
    Values whose std is past float32's range (3.4e38) are refused.
    """
    if responses is not None:
        x = torch.where(responses, x, 0.0)
    x = x.to(torch.float32).to(torch.float64)
    w = lengths.to(torch.float64)
    n = w.sum()
    mean = (w * x).sum() / n.clamp(min=1)
    var = (w * (x - mean) ** 2).sum() / (n - 1).clamp(min=1)
    too_wide = torch.isfinite(var) & (var.sqrt() > torch.finfo(torch.float32).max)
    require(~too_wide, lambda: BatchError(
        f"rewards: the step's values spread too far for float32 (std {var.sqrt().item():.3g}, float32 holds at most "
        "3.4e38): scale the rewards down"))
    return mean.to(torch.float32), var


class ReinforcePP(AdvantageEstimator):
    r"""REINFORCE++ (Hu, arXiv 2501.03262): returns whitened over every valid token of the step.

    With an outcome reward and no discount, every token of response i has return $R_i$
    (or $R_i - \operatorname{mean}_g R$ with ``subtract_group_mean``, the "baseline" variant).
    The whitening statistics weight each response by its length $L_i$, since they run over tokens:

    $$\mu = \frac{\sum_i L_i x_i}{N},\quad \sigma^2 = \frac{\sum_i L_i (x_i - \mu)^2}{N - 1},
    \quad A_i = \frac{x_i - \mu}{\sqrt{\sigma^2 + \epsilon}},\quad N = \sum_i L_i$$

    as veRL's ``masked_whiten`` (unbiased variance, ``eps = 1e-8``). Padding rows (responses
    without a response token) have $L_i = 0$, stay out of the group means too, and get A = 0.

    veRL 0.9.1's estimators, exactly (tests/adapters/verl/test_advantage_conformance.py):
    ``reinforce_plus_plus`` (gamma 1, an outcome reward) is the default; ``reinforce_plus_plus_baseline``
    (``compute_reinforce_plus_plus_baseline_outcome_advantage``) is ``subtract_group_mean: true``,
    a group of one subtracting 0. Step scope: the group means and the whitening span every
    micro-batch and rank of the step; veRL's span its training batch.
    """

    kind: Literal["reinforce_pp"] = "reinforce_pp"
    subtract_group_mean: bool = False
    """Subtract the prompt group's mean reward first (REINFORCE++-baseline)."""
    eps: float = Field(1e-8, ge=0.0, le=1.0)
    """Added to the variance."""

    def fit(self, rewards, group_ids, lengths, responses=None):
        x = rewards.to(torch.float32)
        table = None
        if self.subtract_group_mean:
            table = GroupTable.fit(rewards, group_ids, responses)
            x = x - table.rows(group_ids, responses)[0]
        mean, var = whitening_stats(x, lengths, responses)
        return table, mean, var

    def apply(self, stats, rewards, group_ids, responses=None):
        table, mean, var = stats
        x = rewards.to(torch.float32)
        if table is not None:
            x = x - table.rows(group_ids, responses)[0]
        return zero_padding_rows((x - mean) * torch.rsqrt(var + self.eps), responses)

    def describe(self) -> str:
        x = "R_i - mean_g R" if self.subtract_group_mean else "R_i"
        return f"reinforce_pp: A_i = (x_i - mu) / sqrt(var + {self.eps:g}), x_i = {x}, mu and var over the step's valid tokens"
