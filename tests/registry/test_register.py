"""``rlstab.register``: a component written in Python, usable from YAML and from Python, refused with one line."""

from __future__ import annotations

import multiprocessing as mp
from typing import Literal

import pytest
import torch
from pydantic import Field, ValidationError

import rlstab
from rlstab.clipping import Surrogate
from rlstab.explain import explain
from rlstab.masks import Mask
from rlstab.registry import RegistryError, isolated, registrations
from rlstab.schema import kind_refs, objective_schema


class InProcessCap(Mask):
    """Keep a token only while r <= cap (the issue's RatioCap, under a kind of this test's own)."""

    kind: Literal["in_process_cap"] = "in_process_cap"
    cap: float = Field(2.0, gt=1.0)

    def keep(self, t, threshold=None):
        return (t.ratio <= self.cap).to(t.ratio.dtype)

    def describe(self):
        return f"in_process_cap: keep tokens with r <= {self.cap:g}"


class Unregistered(Mask):
    kind: Literal["never_registered"] = "never_registered"


AGGREGATION = {"kind": "token-mean", "count": "kept"}


@pytest.fixture(autouse=True)
def undo_registrations():
    with isolated():
        yield


def test_a_registered_mask_works_from_yaml_from_python_and_round_trips():
    assert rlstab.register(InProcessCap) is InProcessCap  # usable as a decorator
    from_yaml = rlstab.load("extends: grpo\nmasks:\n- {kind: in_process_cap, cap: 1.5}\n")
    from_python = rlstab.Objective(masks=[InProcessCap(cap=1.5)], aggregation=from_yaml.aggregation)
    assert from_yaml.masks == from_python.masks == [InProcessCap(cap=1.5)]
    assert rlstab.load(from_yaml.to_yaml()) == from_yaml
    assert "masks[0] in_process_cap: keep tokens with r <= 1.5" in explain(from_yaml)
    # One token at r = 2 > 1.5 silenced, one at r = 1 kept: half the valid tokens.
    batch = rlstab.TokenBatch(
        logprobs=torch.log(torch.tensor([[0.8, 0.5]])), old_logprobs=torch.log(torch.tensor([[0.4, 0.5]])),
        advantages=torch.tensor([1.0]), response_mask=torch.ones(1, 2, dtype=torch.bool),
    )
    assert from_yaml.compile()(batch).metrics["mask/in_process_cap/silenced"] == 1.0
    schema = objective_schema()
    assert "in_process_cap" in kind_refs(schema["properties"]["masks"]["items"])


def test_registering_the_same_class_twice_changes_nothing():
    assert not [r for r in registrations("masks") if r.kind == "in_process_cap"]  # undone after the test before
    rlstab.register(InProcessCap)
    rlstab.register(InProcessCap)
    assert [r.cls for r in registrations("masks") if r.kind == "in_process_cap"] == [InProcessCap]


def test_a_class_redefined_under_the_same_name_replaces_the_old_one():
    # A notebook cell run twice defines a new class object with the same module and name.
    def define(cap):
        class Redefined(Mask):
            kind: Literal["redefined_cap"] = "redefined_cap"
            c: float = cap

            def describe(self):
                return "redefined"
        return Redefined

    first, second = define(1.0), define(2.0)
    rlstab.register(first)
    rlstab.register(second)
    assert rlstab.load("extends: grpo\nmasks: [{kind: redefined_cap}]").masks[0].c == 2.0


def test_an_unregistered_instance_names_the_fix():
    with pytest.raises(ValidationError) as err:
        rlstab.Objective(masks=[Unregistered()], aggregation=AGGREGATION)
    assert err.value.errors()[0]["msg"] == (
        "Unregistered (kind 'never_registered') is not registered: call rlstab.register(Unregistered) first, "
        "or declare it in the 'rlstab.components' entry-point group of an installed package"
    )


def test_a_component_of_another_family_is_refused_by_name():
    with pytest.raises(ValidationError) as err:
        rlstab.Objective(surrogate=rlstab.load("stapo").masks[0], aggregation=AGGREGATION)
    assert err.value.errors()[0]["msg"] == "S2T is not a component of surrogate (its base is Surrogate)"


def test_a_kind_held_by_a_built_in_is_refused_naming_both_origins():
    class FakeS2T(Mask):
        kind: Literal["s2t"] = "s2t"

    with pytest.raises(RegistryError) as err:
        rlstab.register(FakeS2T)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"rlstab.register in {__name__}: masks kind 's2t' of {__name__}.FakeS2T from rlstab.register")
    assert "is already registered by rlstab.masks.s2t.S2T from rlstab " in line
    assert type(rlstab.load("stapo").masks[0]).__module__ == "rlstab.masks.s2t"


class NoKind(Mask):
    pass


class BadKind(Surrogate):
    kind: Literal["os.system"] = "os.system"


class NotAComponent:
    kind = "nothing"


@pytest.mark.parametrize(
    "cls, message",
    [
        (NoKind, "NoKind needs a field `kind: Literal['<kind>'] = '<kind>'` naming it in YAML"),
        (BadKind, "BadKind.kind = 'os.system': a kind is 1-64 of a-z, 0-9, '_' and '-', starting with a letter or digit"),
        (NotAComponent, f"<class '{__name__}.NotAComponent'> is not a component class; derive from one of "),
        (int, "<class 'int'> is not a component class; derive from one of rlstab.advantages.base.AdvantageEstimator (advantage), "),
    ],
)
def test_what_cannot_be_registered_says_why(cls, message):
    with pytest.raises(RegistryError) as err:
        rlstab.register(cls)
    assert message in str(err.value) and "\n" not in str(err.value)


def load_in_child(queue) -> None:
    try:
        rlstab.load("extends: grpo\nmasks: [{kind: in_process_cap}]")
        queue.put("loaded")
    except rlstab.ConfigError as err:
        queue.put(str(err))


def test_a_child_process_that_lacks_a_kind_its_parent_registered_names_the_cause():
    # A Ray worker is such a child: it imports rlstab afresh and never sees rlstab.register calls of the driver.
    rlstab.register(InProcessCap)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=load_in_child, args=(queue,))
    child.start()
    message = queue.get(timeout=120)
    child.join(timeout=60)
    assert message.startswith("<yaml text>: masks[0].kind = 'in_process_cap': unknown kind; ")
    assert message.endswith(
        f"('in_process_cap' was registered with rlstab.register in {__name__} by a parent process, such as a Ray "
        "driver: in-process registrations do not reach other processes; install a package that declares it in "
        "the 'rlstab.components' entry-point group on every node)"
    )
