"""Advantage estimators (``advantage:``): how A is computed from rewards when the trainer does not supply it."""

from rlstab.advantages.base import AdvantageEstimator, GroupTable
from rlstab.advantages.gdpo import GDPO
from rlstab.advantages.given import Given
from rlstab.advantages.gpg import GPG
from rlstab.advantages.group import GRPO, RLOO
from rlstab.advantages.grpo_passk import GRPOPassK
from rlstab.advantages.gtpo import GTPOAdvantage
from rlstab.advantages.maxrl import MaxRL
from rlstab.advantages.opo import OPO
from rlstab.advantages.opob import OffPolicyOptimalBaseline, weighted_baseline
from rlstab.advantages.optimal_token_baseline import MultiTurnOptimalTokenBaseline, OptimalTokenBaseline
from rlstab.advantages.reinforce_pp import ReinforcePP

__all__ = ["GTPOAdvantage", "GDPO", "GPG", "GRPO", "OPO", "RLOO", "AdvantageEstimator", "GRPOPassK", "Given", "GroupTable", "MaxRL", "MultiTurnOptimalTokenBaseline", "OffPolicyOptimalBaseline", "OptimalTokenBaseline", "ReinforcePP", "weighted_baseline"]
