"""rlstab.testing.static: the YAML round trip, describe/explain and the JSON Schema, each failing on a component
that breaks it."""

from itertools import count
from typing import Literal

import pytest
import torch

import rlstab
from rlstab.masks.base import Mask
from rlstab.masks.s2t import S2T
from rlstab.registry import isolated
from rlstab.testing.static import TYPO, check_describe_and_explain, check_json_schema, check_yaml_round_trip

_calls = count()


class KeepAll(Mask):
    kind: Literal["kit-keep-all"] = "kit-keep-all"

    def keep(self, t, threshold):
        return torch.ones_like(t.logprobs)


class EmptyDescription(KeepAll):
    kind: Literal["kit-empty-describe"] = "kit-empty-describe"

    def describe(self) -> str:
        return "  "


class ChangingDescription(KeepAll):
    kind: Literal["kit-changing-describe"] = "kit-changing-describe"

    def describe(self) -> str:
        return f"kit-changing-describe: call {next(_calls)}"


class NotAString(KeepAll):
    kind: Literal["kit-describe-bytes"] = "kit-describe-bytes"

    def describe(self):
        return b"keep every token"


class Unregistered(KeepAll):
    kind: Literal["kit-unregistered"] = "kit-unregistered"

    def describe(self) -> str:
        return "kit-unregistered: keep every token"


@pytest.fixture(scope="module", autouse=True)
def registered():
    with isolated():
        for cls in (EmptyDescription, ChangingDescription, NotAString):
            rlstab.register(cls)
        yield


def test_a_builtin_component_passes_all_three():
    for check in (check_yaml_round_trip, check_describe_and_explain, check_json_schema):
        check(S2T(tau_p=0.01))


@pytest.mark.parametrize(("cls", "why"), [
    (EmptyDescription, "describe() returned an empty line"),
    (ChangingDescription, "describe() gives another line when called again"),
    (NotAString, "describe() returned bytes, not a str"),
])
def test_describe_must_be_one_stable_line(cls, why):
    with pytest.raises(AssertionError, match=rf"^masks kind '{cls.model_fields['kind'].default}' .*: check_describe_and_explain: "):
        check_describe_and_explain(cls())
    with pytest.raises(AssertionError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check_describe_and_explain(cls())


def test_an_unregistered_kind_is_not_in_the_schema():
    with pytest.raises(AssertionError, match=r"kind 'kit-unregistered' is not in the schema of 'masks' .*is it registered\?"):
        check_json_schema(Unregistered())


def test_the_misspelt_key_is_one_no_component_has():
    assert TYPO == "kit_misspelt_field" and all(TYPO not in cls.model_fields for cls in (S2T, KeepAll))
