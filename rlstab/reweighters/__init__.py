"""Reweighters (``reweighters:``): positive factors on each token's policy loss. Factors multiply."""

from typing import Annotated

from pydantic import Field

from rlstab.reweighters.base import Reweighter
from rlstab.reweighters.low_probability import LowProbabilityReweight
from rlstab.reweighters.stare import STARE
from rlstab.reweighters.tis import TruncatedIS

AnyReweighter = Annotated[LowProbabilityReweight | TruncatedIS | STARE, Field(discriminator="kind")]

__all__ = ["STARE", "AnyReweighter", "LowProbabilityReweight", "Reweighter", "TruncatedIS"]
