"""Token masks: which tokens train. Masks of an objective are AND-ed."""

from rlstab.masks.base import Mask
from rlstab.masks.bypass import BypassRejection
from rlstab.masks.entropy_quantile import EntropyQuantile
from rlstab.masks.expression import Expression
from rlstab.masks.gtpo_entropy import GTPOEntropyFilter
from rlstab.masks.lopti import Lopti
from rlstab.masks.off_policy_sequence import OffPolicySequence
from rlstab.masks.random_silence import RandomSilence
from rlstab.masks.rollout import IcePop, RolloutRejection, RolloutVeto
from rlstab.masks.s2t import S2T, LowProbability

__all__ = [
    "BypassRejection",
    "EntropyQuantile",
    "Expression",
    "GTPOEntropyFilter",
    "IcePop",
    "Lopti",
    "LowProbability",
    "Mask",
    "OffPolicySequence",
    "RandomSilence",
    "RolloutRejection",
    "RolloutVeto",
    "S2T",
]
