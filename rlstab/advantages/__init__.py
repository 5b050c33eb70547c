"""Advantage estimators (``advantage:``): how A is computed from rewards when the trainer does not supply it."""

from typing import Annotated

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable
from rlstab.advantages.given import Given
from rlstab.advantages.group import GRPO, RLOO
from rlstab.advantages.opob import OffPolicyOptimalBaseline, weighted_baseline
from rlstab.advantages.reinforce_pp import ReinforcePP

AnyAdvantage = Annotated[GRPO | RLOO | ReinforcePP | OffPolicyOptimalBaseline | Given, Field(discriminator="kind")]

__all__ = ["GRPO", "RLOO", "AdvantageEstimator", "AnyAdvantage", "Given", "GroupTable", "OffPolicyOptimalBaseline", "ReinforcePP", "weighted_baseline"]
