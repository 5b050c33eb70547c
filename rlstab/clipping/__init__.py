"""Surrogates and clipping rules (``surrogate:``): the per-token loss l(r, A)."""

from rlstab.clipping.aspo import ASPO, HighEntropyClip
from rlstab.clipping.bapo import BAPO
from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.clipping.cfpo import CFPO
from rlstab.clipping.cispo import CISPO
from rlstab.clipping.clip_cov import ClipCov
from rlstab.clipping.dppo import DPPOBinaryKL, DPPOBinaryTV
from rlstab.clipping.dro import DRO
from rlstab.clipping.gmpo import GMPO
from rlstab.clipping.gppo import GPPO
from rlstab.clipping.gspo import GSPO
from rlstab.clipping.kl_cov import KLCov
from rlstab.clipping.lp_reg import LpReg
from rlstab.clipping.m2po import M2PO
from rlstab.clipping.maspo import MASPO
from rlstab.clipping.pmd_mean import PMDMean
from rlstab.clipping.ppo import NoClip, PPOClip
from rlstab.clipping.reinforce import Reinforce
from rlstab.clipping.sapo import SAPO
from rlstab.clipping.target_po import TargetPO
from rlstab.clipping.topr import TOPR
from rlstab.clipping.vespo import VESPO

__all__ = [
    "ASPO",
    "BAPO",
    "CFPO",
    "CISPO",
    "DRO",
    "GMPO",
    "GPPO",
    "GSPO",
    "M2PO",
    "MASPO",
    "SAPO",
    "TOPR",
    "VESPO",
    "ClipCov",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "HighEntropyClip",
    "KLCov",
    "LpReg",
    "NoClip",
    "PMDMean",
    "PPOClip",
    "Reinforce",
    "Surrogate",
    "SurrogateResult",
    "TargetPO",
]
