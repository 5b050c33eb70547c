"""Regularisers (``regularisers:``): terms added to the policy loss."""

from typing import Annotated

from pydantic import Field

from rlstab.regularisers.base import Regulariser
from rlstab.regularisers.entropy_bonus import EntropyBonus
from rlstab.regularisers.kl import KLPenalty

AnyRegulariser = Annotated[EntropyBonus | KLPenalty, Field(discriminator="kind")]

__all__ = ["AnyRegulariser", "EntropyBonus", "KLPenalty", "Regulariser"]
