"""Surrogates and clipping rules (``surrogate:``): the per-token loss l(r, A)."""

from typing import Annotated

from pydantic import Field

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

AnySurrogate = Annotated[
    PPOClip | NoClip | GSPO | SAPO | CISPO | ASPO | DPPOBinaryTV | DPPOBinaryKL | ClipCov | KLCov | MASPO | BAPO,
    Field(discriminator="kind"),
]

__all__ = [
    "ASPO",
    "BAPO",
    "CISPO",
    "GSPO",
    "MASPO",
    "SAPO",
    "AnySurrogate",
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
