"""``rlstab.registry.families``: each component field's pydantic type, and why a Python object cannot fill it."""

from __future__ import annotations

import typing
from typing import Literal

import pytest
from pydantic import TypeAdapter, ValidationError

import rlstab
from rlstab.clipping import PPOClip, Surrogate
from rlstab.masks import Mask
from rlstab.registry import families
from rlstab.registry.bases import BASES
from rlstab.registry.families import FAMILIES, family_of, with_instance_problems

MASKS = FAMILIES["masks"]


class Unregistered(Mask):
    kind: Literal["never_registered_in_test_families"] = "never_registered_in_test_families"


def test_one_family_per_base_with_its_scope():
    assert {name: (f.name, f.base, f.scope) for name, f in FAMILIES.items()} == {
        name: (name, base, scope) for name, (base, scope) in BASES.items()}
    assert family_of(PPOClip) is family_of(Surrogate) is FAMILIES["surrogate"]
    assert family_of(int) is None


def test_the_annotation_is_the_base_marked_with_its_family():
    assert typing.get_args(MASKS.annotation) == (Mask, MASKS)


def test_a_family_validates_the_kinds_registered_in_it():
    adapter = TypeAdapter(MASKS.annotation)
    stapo = rlstab.load("stapo").masks[0]
    assert adapter.validate_python(stapo.model_dump()) == stapo
    with pytest.raises(ValidationError, match="ppo_clip"):  # a surrogate's kind is no mask's
        adapter.validate_python({"kind": "ppo_clip"})


def test_why_an_object_cannot_fill_the_field():
    assert MASKS.instance_problem({"kind": "s2t"}) is None  # not a component: pydantic's own message stands
    assert MASKS.instance_problem(rlstab.load("stapo").masks[0]) is None  # a registered kind
    wrong = MASKS.instance_problem(PPOClip())
    assert wrong.type == "wrong_family" and str(wrong) == "PPOClip is not a component of masks (its base is Mask)"
    unregistered = MASKS.instance_problem(Unregistered())
    assert unregistered.type == "unregistered_kind"
    assert str(unregistered).startswith(
        "Unregistered (kind 'never_registered_in_test_families') is not registered: call rlstab.register(Unregistered)")


def test_the_objective_says_why_at_the_objects_place():
    aggregation = rlstab.load("grpo").aggregation
    stapo = rlstab.load("stapo").masks[0]
    with pytest.raises(ValidationError) as err:
        rlstab.Objective(masks=[stapo, PPOClip()], aggregation=aggregation)
    (problem,) = err.value.errors(include_url=False)
    assert problem["type"] == "wrong_family" and problem["loc"][:2] == ("masks", 1)  # the second mask, not the first
    assert "PPOClip is not a component of masks" in problem["msg"]


def test_errors_of_anything_else_are_left_as_they_are():
    try:
        rlstab.Objective(masks=[{"kind": "no_such_kind"}], aggregation=rlstab.load("grpo").aggregation)
    except ValidationError as err:
        assert with_instance_problems(err, {"masks": [{"kind": "no_such_kind"}]}) is err  # nothing to add: the same error
    else:
        pytest.fail("an unknown kind was accepted")


def test_a_family_with_no_kind_registered_says_how_to_get_them(monkeypatch):
    monkeypatch.setattr(families, "registrations", lambda name: [])  # rlstab's own entry points missing
    adapter = TypeAdapter(families.Family("masks", Mask, "loss").annotation)
    with pytest.raises(ValidationError, match=r"no masks kind is registered \(rlstab's own entry points are missing"):
        adapter.validate_python({"kind": "s2t"})
