"""Surrogates and clipping rules (``surrogate:``): the per-token loss l(r, A)."""

from typing import Annotated

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.clipping.ppo import NoClip, PPOClip

AnySurrogate = Annotated[PPOClip | NoClip, Field(discriminator="kind")]

__all__ = ["AnySurrogate", "NoClip", "PPOClip", "Surrogate", "SurrogateResult"]
