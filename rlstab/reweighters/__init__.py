"""Reweighters (``reweighters:``): positive factors on each token's policy loss. Factors multiply."""

from rlstab.reweighters.base import Reweighter
from rlstab.reweighters.decoupled_ppo import DecoupledPPO
from rlstab.reweighters.gtpo_conflict import GTPOConflict
from rlstab.reweighters.low_probability import LowProbabilityReweight
from rlstab.reweighters.stare import STARE
from rlstab.reweighters.tis import TruncatedIS

__all__ = ["GTPOConflict", "STARE", "DecoupledPPO", "LowProbabilityReweight", "Reweighter", "TruncatedIS"]
