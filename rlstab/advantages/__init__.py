"""Advantage estimators (``advantage:``): how A is computed from rewards when the trainer does not supply it."""

from rlstab.advantages.base import AdvantageEstimator, GroupTable
from rlstab.advantages.given import Given
from rlstab.advantages.group import GRPO, RLOO
from rlstab.advantages.opob import OffPolicyOptimalBaseline, weighted_baseline
from rlstab.advantages.reinforce_pp import ReinforcePP

__all__ = ["GRPO", "RLOO", "AdvantageEstimator", "Given", "GroupTable", "OffPolicyOptimalBaseline", "ReinforcePP", "weighted_baseline"]
