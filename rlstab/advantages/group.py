"""Group-relative estimators: GRPO, Dr.GRPO (GRPO without std) and RLOO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.lazy import torch


class GRPO(AdvantageEstimator):
    r"""Group-relative advantage (GRPO, DeepSeekMath arXiv 2402.03300; Dr.GRPO arXiv 2503.20783).

    $$A_i = \frac{R_i - \operatorname{mean}_g R}{\operatorname{std}_g R + \epsilon}\quad
    \text{or, with } \texttt{normalize\_std: false} \text{ (Dr.GRPO)},\quad A_i = R_i - \operatorname{mean}_g R$$

    over the responses of the same prompt (group g) in the step. std is unbiased (N-1), as
    ``torch.std`` in veRL and TRL. A group of one response gets mean 0 and std 1, so A = R
    (veRL's convention). Defaults ``normalize_std: true``, ``eps: 1e-6`` (veRL). With ``eps: 0`` a group
    whose rewards are all equal gets A = 0 (the value every eps > 0 gives it), not 0/0.
    Dr.GRPO drops the std because it up-weights groups that are nearly all right or all wrong.
    Padding rows (responses without a response token) are left out of the groups and get A = 0.
    """

    kind: Literal["grpo"] = "grpo"
    normalize_std: bool = True
    """Divide by the group's reward std (GRPO); false gives Dr.GRPO."""
    eps: float = Field(1e-6, ge=0.0, le=1.0)
    """Added to the std."""

    def fit(self, rewards, group_ids, lengths, responses=None):
        return GroupTable.fit(rewards, group_ids, responses)

    def apply(self, stats: GroupTable, rewards, group_ids, responses=None):
        mean, std, _ = stats.rows(group_ids, responses, count=False)
        centred = rewards.to(torch.float32) - mean
        if not self.normalize_std:
            return zero_padding_rows(centred, responses)
        scaled = centred / (std + self.eps)
        if self.eps == 0:  # a group with equal rewards: 0/0; every eps > 0 gives it A = 0, so does eps = 0
            scaled = torch.where(std > 0, scaled, torch.zeros_like(scaled))
        return zero_padding_rows(scaled, responses)

    def describe(self) -> str:
        if self.normalize_std:
            return f"grpo: A_i = (R_i - mean_g R) / (std_g R + {self.eps:g}), std unbiased, g = the prompt's group"
        return "grpo (Dr.GRPO, no std): A_i = R_i - mean_g R, g = the prompt's group"


class RLOO(AdvantageEstimator):
    r"""REINFORCE leave-one-out (Ahmadian et al., arXiv 2402.14740).

    $$A_i = R_i - \frac{1}{n-1}\sum_{j \ne i} R_j = \frac{n}{n-1}\,(R_i - \operatorname{mean}_g R)$$

    over the n responses of the group in the step; a group of one gets A = R (veRL's convention).
    Padding rows (responses without a response token) are left out of n and get A = 0.
    """

    kind: Literal["rloo"] = "rloo"

    def fit(self, rewards, group_ids, lengths, responses=None):
        return GroupTable.fit(rewards, group_ids, responses)

    def apply(self, stats: GroupTable, rewards, group_ids, responses=None):
        mean, _, n = stats.rows(group_ids, responses)
        scale = torch.where(n > 1, n / (n - 1).clamp(min=1), 1.0)
        return zero_padding_rows(scale * (rewards.to(torch.float32) - mean), responses)

    def describe(self) -> str:
        return "rloo: A_i = n/(n-1) (R_i - mean_g R), g = the prompt's group of n"
