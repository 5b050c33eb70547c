"""``rlstab schema`` is standard JSON Schema 2020-12 in which a validator names the actual mistake.

Checked with the ``jsonschema`` package, as an editor or a CI hook would use the published schema:
every preset validates; a wrong type, a misspelt field, an unknown kind and a broken cross-field
rule are each reported at the field that holds the mistake (``best_match``), not as "not valid
under any of the given schemas" or "'<field>' was unexpected".
"""

from __future__ import annotations

import jsonschema
import pytest

import rlstab
from rlstab.schema import DIALECT, objective_schema

SCHEMA = objective_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def best(document: dict) -> jsonschema.ValidationError:
    error = jsonschema.exceptions.best_match(VALIDATOR.iter_errors(document))
    assert error is not None, f"{document} passes the schema"
    return error


def test_it_declares_its_dialect_and_is_a_valid_schema():
    assert SCHEMA["$schema"] == DIALECT
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_preset_validates(name):
    assert not list(VALIDATOR.iter_errors(rlstab.load(name).model_dump(mode="json", exclude_none=True)))


@pytest.mark.parametrize(
    "document, path, message",
    [
        # a wrong type: the field and its type, not "'eps_high' was unexpected"
        ({"surrogate": {"kind": "ppo_clip", "eps_high": "wide"}}, ["surrogate", "eps_high"], "'wide' is not of type 'number'"),
        # a value outside its choices, in a list
        ({"regularisers": [{"kind": "kl", "coef": 0.1, "estimator": "k4"}]}, ["regularisers", 0, "estimator"], "'k4' is not one of"),
        # a misspelt field of a component
        (
            {"masks": [{"kind": "s2t", "tau_pp": 0.1}]}, ["masks", 0],
            "Additional properties are not allowed ('tau_pp' was unexpected)",
        ),
        # an unknown kind: the kinds there are
        ({"aggregation": {"kind": "token_mean", "count": "kept"}}, ["aggregation", "kind"], "'token_mean' is not one of ['seq-mean-token-mean'"),
        # a bound
        ({"masks": [{"kind": "s2t", "tau_p": 2.0}]}, ["masks", 0, "tau_p"], "2.0 is greater than or equal to the maximum of 1.0"),
        # a component without its kind
        ({"surrogate": {"eps_high": 0.3}}, ["surrogate"], "'kind' is a required property"),
    ],
)
def test_best_match_names_the_mistake(document, path, message):
    error = best({"extends": "grpo", **document})
    assert list(error.absolute_path) == path
    assert error.message.startswith(message), error.message


def test_an_expression_mask_takes_exactly_one_of_silence_and_keep():
    both = {"extends": "grpo", "masks": [{"kind": "expression", "silence": "probability < 0.1", "keep": "ratio < 2"}]}
    neither = {"extends": "grpo", "masks": [{"kind": "expression", "keep": None}]}
    one = {"extends": "grpo", "masks": [{"kind": "expression", "keep": "ratio < 2", "silence": None}]}
    assert not VALIDATOR.is_valid(both) and not VALIDATOR.is_valid(neither) and VALIDATOR.is_valid(one)
    for document in (both, neither):
        with pytest.raises(rlstab.ConfigError):  # the loader agrees
            rlstab.load(document)
    rlstab.load(one)


@pytest.mark.parametrize("field", ["masks", "shadow_masks", "reweighters", "regularisers", "reward_shaping"])
def test_each_list_of_components_is_a_list_or_an_append_or_replace_mapping(field):
    component = {"masks": {"kind": "s2t"}, "shadow_masks": {"kind": "s2t"}, "reweighters": {"kind": "tis"},
                 "regularisers": {"kind": "kl", "coef": 0.1}, "reward_shaping": {"kind": "overlong"}}[field]
    for value in ([component], {"append": [component]}, {"replace": [component]}, {"append": []}):
        document = {"extends": "stapo", field: value}
        assert VALIDATOR.is_valid(document), document
        rlstab.load(document)  # the loader agrees
    for value in ({}, {"append": [], "replace": []}, {"apend": [component]}, {"append": component}, 3):
        document = {"extends": "stapo", field: value}
        assert not VALIDATOR.is_valid(document), document
        with pytest.raises(rlstab.ConfigError):
            rlstab.load(document)


@pytest.mark.parametrize(
    "masks, path, message",
    [
        ({"apend": []}, ["masks"], "Additional properties are not allowed ('apend' was unexpected)"),
        ({"append": [{"kind": "s2t", "tau_pp": 0.1}]}, ["masks", "append", 0], "Additional properties are not allowed ('tau_pp' was unexpected)"),
        ({"replace": [{"kind": "s2t", "tau_p": 2.0}]}, ["masks", "replace", 0, "tau_p"], "2.0 is greater than or equal to the maximum of 1.0"),
        ({"append": 3}, ["masks", "append"], "3 is not of type 'array'"),
        ({"append": [], "replace": []}, ["masks"], "{'append': [], 'replace': []} has too many properties"),
        ({}, ["masks"], "{} should be non-empty"),
        (3, ["masks"], "3 is not of type 'array', 'object'"),
    ],
)
def test_best_match_names_the_mistake_in_a_list_form(masks, path, message):
    error = best({"extends": "stapo", "masks": masks})
    assert list(error.absolute_path) == path
    assert error.message.startswith(message), error.message


def test_every_preset_file_as_written_validates():
    """The files themselves, ``extends`` and list forms included (stapo-probability-only writes ``masks: {replace: ...}``)."""
    from rlstab.loading import parse_yaml
    from rlstab.presets import preset_path

    for name in rlstab.preset_names():
        assert not list(VALIDATOR.iter_errors(parse_yaml(preset_path(name).read_text(), name))), name
    assert "replace" in parse_yaml(preset_path("stapo-probability-only").read_text(), "p")["masks"]
