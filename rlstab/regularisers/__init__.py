"""Regularisers (``regularisers:``): terms added to the policy loss."""

from rlstab.regularisers.adaptive_entropy import AdaptiveEntropy
from rlstab.regularisers.base import Regulariser
from rlstab.regularisers.entropy_bonus import EntropyBonus
from rlstab.regularisers.kl import KLPenalty

__all__ = ["AdaptiveEntropy", "EntropyBonus", "KLPenalty", "Regulariser"]
