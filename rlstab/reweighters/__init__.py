"""Reweighters (``reweighters:``): positive factors on each token's policy loss. Factors multiply."""

from typing import Annotated

from pydantic import Field

from rlstab.reweighters.base import Reweighter
from rlstab.reweighters.low_probability import LowProbabilityReweight
from rlstab.reweighters.tis import TruncatedIS

AnyReweighter = Annotated[LowProbabilityReweight | TruncatedIS, Field(discriminator="kind")]

__all__ = ["AnyReweighter", "LowProbabilityReweight", "Reweighter", "TruncatedIS"]
