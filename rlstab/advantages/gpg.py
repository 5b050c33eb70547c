"""GPG's advantage: the group-centred reward, scaled up by the share of the step that carries a gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.lazy import torch


@dataclass(frozen=True)
class GPGState:
    """The step's group table and its one scale ``alpha`` (a 0-d tensor)."""

    table: GroupTable
    alpha: torch.Tensor


class GPG(AdvantageEstimator):
    r"""Group Policy Gradient's advantage (GPG, Chu et al., arXiv 2504.02546, ICLR 2026).

    $$A_i = \alpha\,\frac{R_i - \operatorname{mean}_g R}{F_{norm}},\qquad
      \alpha = \frac{B}{B - M}$$

    over the responses of the prompt's group g; B is the number of responses in the step, M the
    number whose gradient is zero because every response of their group has the same reward
    (the paper's "accurate gradient estimation": the loss is a mean over B, so without alpha the
    groups without signal dilute the others). GPG trains this advantage with the plain policy
    gradient ``-A log pi`` (no ratio, no clip, no KL); the surrogate is a separate component.

    Ambiguities, as options:

    - ``alpha``: ``signal_groups`` (default) is the paper's ``B / (B - M)``, M counting the
      responses of groups of two or more whose rewards are all equal, as the authors' code
      (github AMAP-ML/GPG, ``open-r1/src/open_r1/gpg_trainer.py``: the loss divided by
      ``max(1 - lr_ratio, 0.05)``, ``lr_ratio`` the fraction of groups whose reward std is 0), with
      the same floor ``min_signal_fraction`` on ``(B - M) / B`` (alpha at most 20).
      ``nonzero_rewards`` is veRL 0.9.1's ``compute_gpg_outcome_advantage``: ``alpha = B / max(m,
      1)``, m the number of responses whose reward is not 0 (with 0/1 rewards, the right answers;
      not the paper's M). ``none``: alpha = 1.
    - ``normalize_std``: F_norm = the group's unbiased reward std + ``eps`` instead of 1. The
      README's table reports F_norm = 1 best (with alpha = B/(B-M)), veRL's default
      (``f_norm = 1.0``); the authors' scripts inherit TRL's ``scale_rewards`` (std + 1e-4)
      unless they set it off ("wostd" recipes). Default false.

    A group of one response gets mean 0 (A = alpha R), veRL's convention; it counts towards B and
    never towards M. Step scope: B, M (or m) and the group means span every micro-batch and rank
    of the step (the authors gather the rewards of every process; veRL computes over the training
    batch). Padding rows (no response token) count nowhere and get A = 0. The authors' later
    version resamples until ``(B - M) / B`` reaches a threshold (``min_inverse_alpha``, README
    beta_th = 0.6): that is a sampling rule a trainer would run, not part of this estimator.
    """

    kind: Literal["gpg"] = "gpg"
    alpha: Literal["signal_groups", "nonzero_rewards", "none"] = "signal_groups"
    """How alpha is counted: the paper's B/(B - M) (authors' code), veRL's B/#(R != 0), or 1."""
    min_signal_fraction: float = Field(0.05, gt=0.0, le=1.0)
    """``signal_groups``: floor on (B - M)/B, so alpha <= 1/this (the authors' 0.05)."""
    normalize_std: bool = False
    """Divide by the group's unbiased reward std + eps (F_norm = std) instead of 1."""
    eps: float = Field(1e-4, ge=0.0, le=1.0)
    """Added to the std with ``normalize_std`` (the authors' 1e-4)."""

    def fit(self, rewards, group_ids, lengths, responses=None):
        table = GroupTable.fit(rewards, group_ids, responses)
        real = torch.ones_like(rewards, dtype=torch.bool) if responses is None else responses
        count = real.to(torch.float32).sum()
        if self.alpha == "none":
            alpha = torch.ones((), device=rewards.device)
        elif self.alpha == "nonzero_rewards":
            nonzero = (real & (torch.where(real, rewards, 0.0) != 0)).to(torch.float32).sum()
            alpha = count / nonzero.clamp(min=1.0)
        else:
            _, std, n = table.rows(group_ids, real)
            silent = real & (n > 1) & (std == 0)
            fraction = 1.0 - silent.to(torch.float32).sum() / count.clamp(min=1.0)
            alpha = 1.0 / fraction.clamp(min=self.min_signal_fraction)
        return GPGState(table, alpha)

    def apply(self, stats: GPGState, rewards, group_ids, responses=None):
        mean, std, _ = stats.table.rows(group_ids, responses)
        centred = rewards.to(torch.float32) - mean
        if self.normalize_std:
            centred = centred / (std + self.eps)
        return zero_padding_rows(stats.alpha * centred, responses)

    def step_metrics(self, stats: GPGState) -> dict[str, float]:
        """``alpha``: the step's scale (read once per step, when the step's metrics are read)."""
        return {"alpha": stats.alpha}

    def describe(self) -> str:
        alpha = {
            "signal_groups": f"B / (B - M), M = responses of all-equal groups (at most {1 / self.min_signal_fraction:g})",
            "nonzero_rewards": "B / #(R != 0) (veRL)",
            "none": "1",
        }[self.alpha]
        norm = f" / (std_g R + {self.eps:g})" if self.normalize_std else ""
        return f"gpg: A_i = alpha (R_i - mean_g R){norm}, alpha = {alpha}, over the step's B responses"
