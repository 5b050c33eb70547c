"""Pass@k advantage: only a group's unique best response is rewarded, by its margin over the runner-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.deferred import require
from rlstab.lazy import torch


@dataclass(frozen=True)
class PassKState:
    """Per group (``table`` order): the best reward, how many responses reach it, and the best below it."""

    table: GroupTable
    best: torch.Tensor
    at_best: torch.Tensor
    runner_up: torch.Tensor


@dataclass(frozen=True)
class ClosedFormState:
    """Per group (``table`` order), Pass@k Training's advantage of a right and of a wrong response."""

    table: GroupTable
    positive: torch.Tensor
    negative: torch.Tensor


def binomial_ratio(top: torch.Tensor, bottom: torch.Tensor, j: int) -> torch.Tensor:
    """``C(top, j) / C(bottom, j)`` elementwise (float64, ``bottom >= j``), from log-gammas; 0 where ``top < j``
    or ``top < 0`` (scipy's ``comb`` gives 0 there)."""
    if j == 0:
        return torch.where(top >= 0, 1.0, 0.0).to(torch.float64)
    ok = top >= j
    t = torch.where(ok, top, float(j))  # a safe argument where the ratio is 0 anyway
    log = torch.lgamma(t + 1) - torch.lgamma(t - j + 1) - torch.lgamma(bottom + 1) + torch.lgamma(bottom - j + 1)
    return torch.where(ok, torch.exp(log), 0.0)


class GRPOPassK(AdvantageEstimator):
    r"""The leave-one-out advantage of the group's maximum reward (pass@k with k = the group size).

    $$A_i = \max_{j \in g} R_j - \max_{j \in g,\, j \ne i} R_j\quad\Bigl(/\,(\operatorname{std}_g R + \epsilon)
      \text{ with } \texttt{normalize\_std}\Bigr)$$

    The objective is the best reward of the group (pass@n for 0/1 rewards); the baseline of
    response i is the best reward of the others, so only a unique best response has a non-zero
    advantage, its margin over the runner-up, and every other response gets 0 (ties at the top:
    all 0). This is veRL 0.9.1's ``compute_grpo_passk_outcome_advantage`` (which cites Tang et al.,
    "Optimizing Language Models for Inference Time Objectives using RL", arXiv 2503.19595, whose
    leave-one-out pass@k gradient this is for k = n).

    ``k`` (an integer) selects instead the closed-form advantage of "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation of Large Reasoning Models" (Chen et al., arXiv
    2508.10751, eqs. 14-15): the pass@k reward of every k-subset of the group of n responses, c of
    them right (binary rewards), assigned back to the responses in closed form,

    $$\bar R = 1 - \frac{\binom{n-c}{k}}{\binom{n}{k}},\quad \sigma = \sqrt{\bar R(1 - \bar R)},\quad
      A_{right} = \frac{1 - \bar R}{\sigma + \epsilon},\quad
      A_{wrong} = \frac{1 - \bar R - \binom{n-c-1}{k-1} / \binom{n-1}{k-1}}{\sigma + \epsilon}$$

    as the authors' ``calc_adv`` (github RUCAIBox/Passk_Training, ``code/passk_adv.py``: eps 1e-6
    on sigma; a binomial with a negative or too small top is 0, as scipy's ``comb``). It needs
    rewards of 0 or 1 and groups of at least k responses (errors otherwise); ``normalize_std:
    false`` leaves out the division by sigma + eps. k = n is not the leave-one-out form: every
    k-subset is then the whole group, whose reward all responses share (A = 0).

    Defaults are veRL's: ``k`` null (the leave-one-out form), ``normalize_std`` true
    (``algorithm.norm_adv_by_std_in_grpo``, std unbiased over the group), ``eps`` 1e-6.

    **Rollout groups** (what the trainer runs): every group of the step must hold at least two
    responses, all of the prompt's rollouts, since the baseline is the best of the others; a
    group of one is an error, as in veRL, raised when the step is fitted (or, in a deferring call,
    when its metrics are read). rlstab's embedded trainer cuts mini-batches of whole groups, and
    veRL fits advantages over the whole training batch. Padding rows count nowhere and get A = 0.
    """

    kind: Literal["grpo_passk"] = "grpo_passk"
    k: int | None = Field(None, ge=1, le=4096)
    """Null: the leave-one-out max (veRL). An integer: Pass@k Training's closed form for binary rewards."""
    normalize_std: bool = True
    """Divide by the group's unbiased reward std + eps (veRL's ``norm_adv_by_std_in_grpo``); with ``k``, by sigma + eps."""
    eps: float = Field(1e-6, ge=0.0, le=1.0)
    """Added to the std (to sigma with ``k``: the authors' 1e-6)."""

    def fit(self, rewards, group_ids, lengths, responses=None):
        table = GroupTable.fit(rewards, group_ids, responses)
        real = torch.ones_like(rewards, dtype=torch.bool) if responses is None else responses
        if self.k is not None:
            return self._fit_closed_form(table, rewards, group_ids, real)

        def alone() -> ValueError:
            ids = table.keys[table.count == 1].tolist()[:5]
            return ValueError(
                f"advantage (grpo_passk): groups {ids} hold one response in the step; pass@k needs at least two per "
                "prompt group (all of its rollouts in the step whose advantages are fitted)"
            )

        require(~(table.count == 1).any(), alone)
        groups = table.keys.numel()
        if groups == 0:
            empty = torch.zeros(0, device=rewards.device)
            return PassKState(table, empty, empty, empty)
        inverse = torch.searchsorted(table.keys, group_ids.contiguous()).clamp(max=groups - 1)
        low = torch.full((groups,), -torch.inf, device=rewards.device)
        values = torch.where(real, rewards.to(torch.float32), -torch.inf)
        best = low.scatter_reduce(0, inverse, values, "amax")
        is_best = real & (values == best[inverse])
        at_best = torch.zeros(groups, device=rewards.device).index_add(0, inverse, is_best.to(torch.float32))
        runner_up = low.scatter_reduce(0, inverse, torch.where(is_best, -torch.inf, values), "amax")
        return PassKState(table, best, at_best, runner_up)

    def _fit_closed_form(self, table: GroupTable, rewards, group_ids, real) -> ClosedFormState:
        k = self.k
        values = torch.where(real, rewards.to(torch.float32), 0.0)

        def not_binary() -> ValueError:
            bad = values[real & (values != 0) & (values != 1)].unique().tolist()[:5]
            return ValueError(f"advantage (grpo_passk, k = {k}): the closed form needs rewards of 0 or 1, got {bad}")

        def too_small() -> ValueError:
            ids = table.keys[(table.count > 0) & (table.count < k)].tolist()[:5]
            return ValueError(f"advantage (grpo_passk, k = {k}): groups {ids} hold fewer than k = {k} responses in the step")

        require(((values == 0) | (values == 1) | ~real).all(), not_binary)
        require(((table.count >= k) | (table.count == 0)).all(), too_small)
        groups = table.keys.numel()
        inverse = torch.searchsorted(table.keys, group_ids.contiguous()).clamp(max=max(groups - 1, 0))
        right = torch.zeros(groups, dtype=torch.float64, device=rewards.device).index_add(
            0, inverse, (real & (values == 1)).to(torch.float64))
        n = table.count.to(torch.float64)
        pass_k = 1.0 - binomial_ratio(n - right, n, k)  # the group's mean pass@k reward over its k-subsets
        sigma = torch.sqrt((pass_k * (1.0 - pass_k)).clamp(min=0.0))
        positive = 1.0 - pass_k
        negative = 1.0 - pass_k - binomial_ratio(n - right - 1.0, n - 1.0, k - 1)
        if self.normalize_std:
            positive, negative = positive / (sigma + self.eps), negative / (sigma + self.eps)
        return ClosedFormState(table, positive.to(torch.float32), negative.to(torch.float32))

    def apply(self, stats: PassKState | ClosedFormState, rewards, group_ids, responses=None):
        index = stats.table.lookup(group_ids, responses)
        if stats.table.keys.numel() == 0:  # padding rows of an empty step
            return torch.zeros(rewards.shape, device=rewards.device)
        if isinstance(stats, ClosedFormState):
            right = rewards.to(torch.float32) == 1
            return zero_padding_rows(torch.where(right, stats.positive[index], stats.negative[index]), responses)
        best, runner_up = stats.best[index], stats.runner_up[index]
        unique_best = (rewards.to(torch.float32) == best) & (stats.at_best[index] == 1)
        margin = torch.where(unique_best, best - torch.where(unique_best, runner_up, 0.0), 0.0)
        if self.normalize_std:
            margin = margin / (stats.table.std[index] + self.eps)
        return zero_padding_rows(margin, responses)

    def describe(self) -> str:
        if self.k is not None:
            norm = f" / (sigma + {self.eps:g})" if self.normalize_std else ""
            return (f"grpo_passk (k = {self.k}, Pass@k Training): right: (1 - P){norm}, wrong: (1 - P - C(n-c-1, k-1) / "
                    f"C(n-1, k-1)){norm}, P = 1 - C(n-c, k) / C(n, k), sigma = sqrt(P (1 - P)), c right of n in the group")
        norm = f" / (std_g R + {self.eps:g})" if self.normalize_std else ""
        return f"grpo_passk: A_i = (max_g R - max_(g without i) R){norm}: only a unique best response, its margin over the runner-up"
