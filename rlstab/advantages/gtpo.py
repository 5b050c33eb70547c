"""GTPO's advantage: the group-centred reward less a multiple of the response's mean entropy."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.lazy import torch


def mean_entropy(entropy: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B]`` float32: each response's mean token entropy over its valid tokens (0 for a row without one).

    ``entropy`` and ``valid`` are ``[B, T]`` (a bool ``valid``); padding may hold anything."""
    total = torch.where(valid, entropy, 0.0).sum(-1)
    return total / valid.sum(-1).clamp(min=1).to(total.dtype)


class GTPOAdvantage(AdvantageEstimator):
    r"""GTPO's advantage (Simoni et al., arXiv 2508.03772): the group-centred reward with an entropy penalty.

    $$A_i = R_i - \operatorname{mean}_g R - \gamma\,\langle H\rangle_i,\qquad
    \langle H\rangle_i = \frac{1}{|o_i|}\sum_{t=1}^{|o_i|} H_{i,t}$$

    over the responses of the same prompt (group g) in the step, $H_{i,t}$ the entropy of the policy's
    next-token distribution at token t (``TokenBatch.entropy``), averaged over the response's valid tokens.
    This is the factor $(\mathcal{A}_i - \gamma\langle H\rangle_i)$ of the objective the authors state
    (README of github winstonsmith1897/GTPO); the filter $\delta_i$ that multiplies it is the mask
    ``gtpo_entropy_filter``, and the conflict-token weight $\lambda_{i,t}$ the reweighter ``gtpo_conflict``.

    Defaults are the authors' code (``gtpo/gtpo_training.py``): their trainer's input preparation centres the rewards,
    ``advantages = rewards - mean_grouped_rewards``, with the division by the group's std commented out
    (``normalize_std: false``; ``true`` divides by the unbiased std plus ``eps``, as GRPO); then
    ``UnslothEfficientGTPO.forward`` subtracts ``ENT_SCALE * entropies`` with ``ENT_SCALE = 0.1`` ($\gamma$,
    ``entropy_scale``) from every response's advantage, those whose reward equals the group mean included
    (they train on $-\gamma\langle H\rangle_i$). Their entropy is the current policy's
    (``compute_completion_stats``, on the new logits), equal to the old policy's on their single update per
    rollout; rlstab reads whatever entropy the trainer passes (the embedded trainer's is the current policy's
    before the update). The group mean runs over the whole step (every micro-batch and rank), as every
    estimator's. A group of one response gets mean 0 (A = R - gamma <H>, veRL's convention); padding rows
    get A = 0.
    """

    kind: Literal["gtpo"] = "gtpo"
    entropy_scale: float = Field(0.1, ge=0.0)
    """gamma: the multiple of the response's mean token entropy subtracted from its advantage."""
    normalize_std: bool = False
    """Divide the centred reward by the group's reward std plus eps (the authors' code does not)."""
    eps: float = Field(1e-6, ge=0.0, le=1.0)
    """Added to the std (with ``normalize_std``)."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards", "group_ids", "entropy"})

    def fit(self, rewards, group_ids, lengths, responses=None):
        return GroupTable.fit(rewards, group_ids, responses)

    def apply(self, stats, rewards, group_ids, responses=None):
        raise TypeError("advantage (gtpo) reads each response's entropy: call micro_batch_advantages(stats, tokens, ...)")

    def micro_batch_advantages(self, stats: GroupTable, t, rewards, group_ids, responses=None):
        mean, std, _ = stats.rows(group_ids, responses, count=False)
        centred = rewards.to(torch.float32) - mean
        if self.normalize_std:
            scaled = centred / (std + self.eps)
            centred = torch.where(std > 0, scaled, torch.zeros_like(scaled)) if self.eps == 0 else scaled
        entropy = mean_entropy(t.entropy, t.valid_bool)
        return zero_padding_rows(centred - self.entropy_scale * entropy, responses)

    def describe(self) -> str:
        centred = f"(R_i - mean_g R) / (std_g R + {self.eps:g})" if self.normalize_std else "R_i - mean_g R"
        return (
            f"gtpo: A_i = {centred} - {self.entropy_scale:g} <H>_i, <H>_i = the response's mean token entropy, "
            "g = the prompt's group"
        )
