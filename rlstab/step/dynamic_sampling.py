"""DAPO dynamic sampling: drop the prompt groups whose rewards are all equal."""

from __future__ import annotations

from typing import ClassVar, Literal

from rlstab.lazy import torch
from rlstab.step.base import GroupFilter


def uniform_groups(rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted ids of the groups that have at least two responses and all-equal rewards.

    ``responses``: ``[B]`` bool, False on padding rows (no response token), which are left out
    whatever their reward and group id hold (None: every row counts).
    """
    return group_summary(rewards, group_ids, responses)[0]


def group_summary(rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor | None):
    """The uniform groups' ids, and the number of groups with at least one response that is not padding."""
    # Host syncs: the number of groups, and which groups drop (the rows the step keeps).
    keys, inverse = torch.unique(group_ids.to(torch.int64), sorted=True, return_inverse=True)
    r = rewards.to(torch.float64)
    r_high = r_low = r
    if responses is None:
        count = torch.bincount(inverse, minlength=keys.numel())
    else:  # a padding row can neither raise the maximum nor lower the minimum, nor count
        r_high, r_low = torch.where(responses, r, -torch.inf), torch.where(responses, r, torch.inf)
        count = torch.zeros(keys.numel(), dtype=torch.int64, device=r.device).index_add_(
            0, inverse, responses.to(torch.int64))
    high = torch.full((keys.numel(),), -torch.inf, dtype=torch.float64, device=r.device).scatter_reduce_(
        0, inverse, r_high, "amax")
    low = torch.full((keys.numel(),), torch.inf, dtype=torch.float64, device=r.device).scatter_reduce_(
        0, inverse, r_low, "amin")
    return keys[(count >= 2) & (high == low)], int((count > 0).sum())


def filter_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool, True for the responses DAPO's dynamic sampling keeps (call it before training).

    A group (the responses to one prompt) is dropped when it has at least two responses and all
    their rewards are equal: its group-relative advantages are all zero, so it only dilutes the
    batch. A trainer keeps sampling prompts until enough groups survive (DAPO, arXiv 2503.14476,
    section 3.2)::

        kept = []
        while sum(len(g) for g in kept) < batch_size:
            rollout = sample(next_prompts)
            keep = rlstab.step.filter_groups(rollout.acc, rollout.group_ids)
            kept.append(rollout[keep])

    Pass the reward the filter should look at: DAPO's veRL recipe filters on the accuracy
    (``filter_groups.metric: acc``), before overlong shaping makes rewards length-dependent.
    """
    return ~torch.isin(group_ids.to(torch.int64), uniform_groups(rewards, group_ids))


class DynamicSampling(GroupFilter):
    r"""DAPO's dynamic sampling, inside the loss: responses of uniform groups become padding.

    $$\text{drop group } g \text{ iff } |g| \ge 2 \wedge \max_{i \in g} R_i = \min_{i \in g} R_i$$

    DAPO (arXiv 2503.14476, eq. 11's constraint $0 < |\{o_i \text{ correct}\}| < G$; veRL's
    ``filter_groups``, which evicts a group iff it has more than one response and the std of its
    metric is 0) filters the batch before the update. The exact equivalent here: over the whole
    step (every micro-batch and rank), the groups with all-equal rewards are found (padding rows,
    responses without a response token, are left out of the groups), and their
    responses are treated as padding *before anything else is computed*: they leave the
    advantage estimator's statistics (REINFORCE++ weights responses by their valid length, now 0;
    group estimators never mix groups), every mask population and every denominator. Equality is
    exact (``max == min``) where veRL tests a float std against 0.

    The better place is still the trainer: dropping groups before the forward pass saves their
    compute, and only the trainer can sample more prompts to refill the batch
    ([`filter_groups`][rlstab.step.filter_groups]). In the loss, the batch just gets smaller.

    ``on: rewards`` filters on ``TokenBatch.rewards`` as the trainer passed them (DAPO filters on
    accuracy before overlong shaping); ``shaped_rewards`` on the rewards after the objective's
    ``reward_shaping``. Reads ``rewards`` and ``group_ids`` on every micro-batch, also when the
    trainer supplies advantages.
    """

    kind: Literal["dynamic_sampling"] = "dynamic_sampling"
    on: Literal["rewards", "shaped_rewards"] = "rewards"
    """Which rewards must differ within a group for it to train."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards", "group_ids"})

    def judges_shaped_rewards(self) -> bool:
        return self.on == "shaped_rewards"

    def dropped_groups(self, rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor) -> tuple[torch.Tensor, int]:
        return group_summary(rewards, group_ids, responses)

    def describe(self) -> str:
        what = "rewards" if self.on == "rewards" else "shaped rewards"
        return (
            f"dynamic_sampling: responses of groups (>= 2 responses) with all-equal {what} over the step "
            "are padding (they leave the estimator, the masks and every denominator)"
        )
