"""What every advantage estimator provides.

An estimator is fitted once on the whole step — every response's reward, group id and length,
gathered from every micro-batch and rank — and then applied to each micro-batch. Group
statistics are thus exact even when a group's responses land in different micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlstab.components import Component


@dataclass(frozen=True)
class GroupTable:
    """Per-group reward statistics of a step: sorted group ids and their mean, std and size."""

    keys: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    count: torch.Tensor

    @classmethod
    def fit(cls, rewards: torch.Tensor, group_ids: torch.Tensor) -> GroupTable:
        """Mean and unbiased std per group; a group of one gets mean 0 and std 1 (veRL's convention)."""
        keys, inverse = torch.unique(group_ids, sorted=True, return_inverse=True)
        rewards = rewards.to(torch.float32)
        count = torch.bincount(inverse, minlength=keys.numel()).to(torch.float32)
        total = torch.zeros_like(count).index_add_(0, inverse, rewards)
        mean = total / count
        sq = torch.zeros_like(count).index_add_(0, inverse, (rewards - mean[inverse]) ** 2)
        std = (sq / (count - 1).clamp(min=1)).sqrt()
        single = count == 1
        mean = torch.where(single, 0.0, mean)
        std = torch.where(single, 1.0, std)
        return cls(keys=keys, mean=mean, std=std, count=count)

    def lookup(self, group_ids: torch.Tensor) -> torch.Tensor:
        """Row of each id in the table; an id the step did not contain is an error."""
        idx = torch.searchsorted(self.keys, group_ids).clamp(max=self.keys.numel() - 1)
        if not torch.equal(self.keys[idx], group_ids):
            missing = group_ids[self.keys[idx] != group_ids].unique().tolist()[:5]
            raise ValueError(f"group_ids {missing} were not in the step the advantages were fitted on")
        return idx


class AdvantageEstimator(Component):
    """Base class of advantage estimators (``advantage:`` in an objective)."""

    reads = frozenset({"rewards", "group_ids"})

    def fit(self, rewards: torch.Tensor, group_ids: torch.Tensor, lengths: torch.Tensor) -> object:
        """Statistics of the whole step. ``lengths`` are each response's valid-token counts."""
        raise NotImplementedError

    def apply(self, stats: object, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``[B]`` advantages of one micro-batch's responses."""
        raise NotImplementedError
