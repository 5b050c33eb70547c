"""Bases of the step-level families: ``reward_shaping:``, ``group_filter:`` and ``lr_scale:``.

Each is what the compiled objective calls once per step (``rlstab.step.level``), so a component
of the family, built in or from a plugin, is executed the same way in every trainer.
"""

from __future__ import annotations

from typing import ClassVar

from rlstab.components import Component
from rlstab.lazy import torch


class RewardShaping(Component):
    """Base of ``reward_shaping:`` components: a term added to each response's reward before the estimator."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards"})

    def penalty(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[B]`` float32 term added to the rewards of responses with ``lengths`` response tokens."""
        raise NotImplementedError


class GroupFilter(Component):
    """Base of ``group_filter:`` components: which prompt groups of the step train (the others become padding)."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards", "group_ids"})

    def judges_shaped_rewards(self) -> bool:
        """Whether the filter sees the rewards after ``reward_shaping`` (else as the trainer passed them)."""
        return False

    def dropped_groups(self, rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``(sorted ids of the groups to drop, number of groups with a response)`` over the whole step.

        ``rewards``, ``group_ids``, ``responses`` (bool: the row has a response token) are ``[N]``
        over every micro-batch and rank of the step.
        """
        raise NotImplementedError


class LearningRateScale(Component):
    """Base of ``lr_scale:`` components: a factor for the step's learning rate, returned as ``StepStats.lr_scale``."""

    def log_weights(self, t) -> torch.Tensor:
        """``[n]`` float64 per-response log weights of one micro-batch (concatenated over the step)."""
        raise NotImplementedError

    def scale(self, log_weights: torch.Tensor) -> tuple[float, float]:
        """``(factor, effective sample size)`` from the step's log weights."""
        raise NotImplementedError
