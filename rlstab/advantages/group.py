"""Group-relative estimators: GRPO, Dr.GRPO (GRPO without std) and RLOO."""

from __future__ import annotations

from typing import ClassVar, Literal

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

    ``std: population`` divides the squared deviations by n instead of n - 1, and ``std_floor``
    leaves a group whose std is at or below it undivided ($A_i = R_i - \operatorname{mean}_g R$).
    Together, with ``eps: 0``, they give Target PO's score standardisation (Kaddour, arXiv
    2604.06159, appendix A: the population std, and zero scores when the group's std is 0), as the
    authors' code computes it (``JeanKaddour/tpo``, ``src/tpo/algorithms.py``, ``tpo_skill``: the
    population std, dividing only where it exceeds 1e-6) and TRL's TargetPO trainer
    (``TargetPOTrainer.get_tpo_scores``, TRL pull request 5591): the ``target_po`` preset.
    """

    _later_fields: ClassVar[tuple[str, ...]] = ("std", "std_floor")

    kind: Literal["grpo"] = "grpo"
    normalize_std: bool = True
    """Divide by the group's reward std (GRPO); false gives Dr.GRPO."""
    eps: float = Field(1e-6, ge=0.0, le=1.0)
    """Added to the std."""
    std: Literal["unbiased", "population"] | None = None
    """The group's std: ``unbiased`` (n - 1, veRL and TRL; null means this) or ``population`` (n, Target PO)."""
    std_floor: float | None = Field(None, ge=0.0, le=1.0)
    """A group whose std is at or below this is not divided: A = R - mean (Target PO: 1e-6); null: none."""

    def fit(self, rewards, group_ids, lengths, responses=None):
        return GroupTable.fit(rewards, group_ids, responses, unbiased=self.std != "population")

    def apply(self, stats: GroupTable, rewards, group_ids, responses=None):
        mean, std, _ = stats.rows(group_ids, responses, count=False)
        centred = rewards.to(torch.float32) - mean
        if not self.normalize_std:
            return zero_padding_rows(centred, responses)
        scaled = centred / (std + self.eps)
        if self.eps == 0:  # a group with equal rewards: 0/0; every eps > 0 gives it A = 0, so does eps = 0
            scaled = torch.where(std > 0, scaled, torch.zeros_like(scaled))
        if self.std_floor is not None:
            scaled = torch.where(std > self.std_floor, scaled, centred)
        return zero_padding_rows(scaled, responses)

    def describe(self) -> str:
        if self.normalize_std:
            std = "population" if self.std == "population" else "unbiased"
            floor = "" if self.std_floor is None else f"; undivided where std_g R <= {self.std_floor:g}"
            return f"grpo: A_i = (R_i - mean_g R) / (std_g R + {self.eps:g}), std {std}, g = the prompt's group{floor}"
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
