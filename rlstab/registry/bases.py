"""The families' base classes: which objective field a component class fills, by what it derives from.

The table the registry checks a class against when it registers it, apart from the families'
pydantic types ([`Family`][rlstab.registry.Family]), which ask the registry for their kinds: the
registry imports this module, the families import the registry, and nothing imports back.
"""

from __future__ import annotations

from rlstab.advantages.base import AdvantageEstimator
from rlstab.aggregation import Aggregation
from rlstab.clipping.base import Surrogate
from rlstab.components import Component
from rlstab.exploration.base import Rollout, StreamWeighting
from rlstab.masks.base import Mask
from rlstab.regularisers.base import Regulariser
from rlstab.reweighters.base import Reweighter
from rlstab.sampling.base import Sampler
from rlstab.step.base import GroupFilter, LearningRateScale, RewardShaping

BASES: dict[str, tuple[type[Component], str]] = {
    "advantage": (AdvantageEstimator, "step"),
    "masks": (Mask, "loss"),
    "reweighters": (Reweighter, "loss"),
    "surrogate": (Surrogate, "loss"),
    "aggregation": (Aggregation, "loss"),
    "regularisers": (Regulariser, "loss"),
    "reward_shaping": (RewardShaping, "step"),
    "group_filter": (GroupFilter, "step"),
    "lr_scale": (LearningRateScale, "step"),
    "dual_stream": (StreamWeighting, "loss"),
    "sampler": (Sampler, "trainer"),
    "rollout": (Rollout, "trainer"),
}
"""Family name (the objective field) -> (base class, scope), in the objective's field order."""


def family_name_of(cls: type) -> str | None:
    """The family whose base ``cls`` derives from, or None (none, or several)."""
    found = [name for name, (base, _) in BASES.items() if isinstance(cls, type) and issubclass(cls, base)]
    return found[0] if len(found) == 1 else None
