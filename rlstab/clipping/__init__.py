"""Surrogates and clipping rules (``surrogate:``): the per-token loss l(r, A)."""

from rlstab.clipping.aspo import ASPO, HighEntropyClip
from rlstab.clipping.bapo import BAPO
from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.clipping.cispo import CISPO
from rlstab.clipping.clip_cov import ClipCov
from rlstab.clipping.dppo import DPPOBinaryKL, DPPOBinaryTV
from rlstab.clipping.gspo import GSPO
from rlstab.clipping.kl_cov import KLCov
from rlstab.clipping.maspo import MASPO
from rlstab.clipping.ppo import NoClip, PPOClip
from rlstab.clipping.sapo import SAPO

__all__ = [
    "ASPO",
    "BAPO",
    "CISPO",
    "GSPO",
    "MASPO",
    "SAPO",
    "ClipCov",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "HighEntropyClip",
    "KLCov",
    "NoClip",
    "PPOClip",
    "Surrogate",
    "SurrogateResult",
]
