"""OPO's optimal reward baseline: the group's rewards averaged with each response's length as weight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.lazy import torch


@dataclass(frozen=True)
class OPOState:
    """The step's group table and each group's length-weighted baseline (``table`` order)."""

    table: GroupTable
    baseline: torch.Tensor


class OPO(AdvantageEstimator):
    r"""OPO's optimal reward baseline ("On-Policy RL with Optimal Reward Baseline", Hao et al., arXiv 2505.23585).

    $$b_g = \frac{\sum_{i \in g} L_i R_i}{\sum_{i \in g} L_i},\qquad A_i = R_i - b_g$$

    over the responses of the prompt's group g in the step, ``L_i`` the response's valid-token
    count. The baseline that minimises the policy gradient's variance weights each reward by
    ``||grad log pi(y_i)||^2``; OPO takes that squared norm as proportional to the length (the
    paper's optimal-baseline equation, under its assumption that token gradients are
    near-orthogonal and of similar size). VCPO's ``opob`` is the same baseline with the measured
    norms (``rlstab.advantages.opob``).

    A group of one response gets ``b = 0`` (A = R), as veRL 0.9.1's ``compute_opo_outcome_advantage``;
    no std division, no whitening (veRL's function, the paper's algorithm). A group whose
    responses all have length 0 (every token rejected) gets the plain mean as baseline instead of
    0/0. Padding rows count nowhere and get A = 0. The lengths are the tokens the step trains
    (after rollout rejection), as REINFORCE++'s whitening counts them; veRL counts its
    ``response_mask``.

    **What the trainer runs** (declared, not computed here): the baseline needs every response of
    a prompt in the step whose advantages are fitted (rlstab's embedded trainer cuts mini-batches
    of whole groups; veRL fits advantages over the whole training batch), and OPO's other half is
    *exact on-policy* training: one optimizer step per rollout batch (embedded trainer
    ``updates_per_step: 1``; veRL ``ppo_mini_batch_size`` = ``data.train_batch_size`` and
    ``ppo_epochs=1``, as the paper's scripts). The estimator computes the same thing on any step;
    whether the step is on-policy is the trainer's schedule.
    """

    kind: Literal["opo"] = "opo"

    def fit(self, rewards, group_ids, lengths, responses=None):
        table = GroupTable.fit(rewards, group_ids, responses)
        real = torch.ones_like(rewards, dtype=torch.bool) if responses is None else responses
        inverse = torch.searchsorted(table.keys, group_ids.contiguous()).clamp(max=max(table.keys.numel() - 1, 0))
        weight = torch.where(real, lengths.to(torch.float32), 0.0)
        weighted = torch.where(real, weight * rewards.to(torch.float32), 0.0)
        zeros = torch.zeros(table.keys.numel(), device=rewards.device)
        total_weight = zeros.index_add(0, inverse, weight)
        baseline = zeros.index_add(0, inverse, weighted) / total_weight.clamp(min=1.0)
        # all lengths 0: the plain mean (GroupTable's, which is 0 for a group of one)
        baseline = torch.where(total_weight > 0, baseline, table.mean)
        baseline = torch.where(table.count > 1, baseline, 0.0)
        return OPOState(table, baseline)

    def apply(self, stats: OPOState, rewards, group_ids, responses=None):
        index = stats.table.lookup(group_ids, responses)
        if stats.table.keys.numel() == 0:  # padding rows of an empty step
            return torch.zeros(rewards.shape, device=rewards.device)
        return zero_padding_rows(rewards.to(torch.float32) - stats.baseline[index], responses)

    def describe(self) -> str:
        return "opo: A_i = R_i - sum_g L_j R_j / sum_g L_j, L = valid tokens, g = the prompt's group (one response: b = 0)"
