"""``rlstab.registry.bases``: which objective field a component class fills, by the base it derives from."""

from __future__ import annotations

from typing import Literal

from rlstab.advantages import GRPO
from rlstab.clipping import PPOClip, Surrogate
from rlstab.components import Component
from rlstab.masks import Mask
from rlstab.objective import Objective
from rlstab.registry.bases import BASES, family_name_of
from rlstab.reweighters.base import Reweighter


class NewMask(Mask):
    """A mask nobody registered: its family comes from its base alone."""

    kind: Literal["new_mask_of_test_bases"] = "new_mask_of_test_bases"


class MaskAndReweighter(Mask, Reweighter):
    kind: Literal["two_families"] = "two_families"


def test_the_families_follow_the_objectives_field_order():
    # shadow_masks is an objective field of the masks family, not a family of its own
    assert [name for name in Objective.model_fields if name in BASES] == list(BASES)
    assert set(Objective.model_fields) & set(BASES) == set(BASES)
    assert {scope for _, scope in BASES.values()} == {"loss", "step", "trainer"}


def test_a_class_belongs_to_the_family_of_its_base():
    assert family_name_of(PPOClip) == family_name_of(Surrogate) == "surrogate"
    assert family_name_of(GRPO) == "advantage"
    assert family_name_of(NewMask) == "masks"  # registered or not


def test_a_class_of_no_family_or_of_two_has_none():
    assert family_name_of(Component) is None  # the root of every family is none of them
    assert family_name_of(int) is None
    assert family_name_of(MaskAndReweighter) is None  # ambiguous: refused, not the first match
    assert family_name_of(PPOClip()) is None  # an instance, not a class
