"""Token masks: which tokens train. Masks of an objective are AND-ed."""

from typing import Annotated

from pydantic import Field

from rlstab.masks.base import Mask
from rlstab.masks.entropy_quantile import EntropyQuantile
from rlstab.masks.s2t import S2T, LowProbability

AnyMask = Annotated[S2T | LowProbability | EntropyQuantile, Field(discriminator="kind")]

__all__ = ["AnyMask", "EntropyQuantile", "LowProbability", "Mask", "S2T"]
