"""The YAML reader: YAML 1.2 core-schema scalars, the forms it refuses, anchors, and text that round-trips."""

from __future__ import annotations

import math

import pytest
import yaml

import rlstab
from rlstab import ConfigError
from rlstab.loading import parse_yaml
from rlstab.loading.yaml12 import resolve_plain
from rlstab.yaml_core_schema import dump_yaml

# Plain scalar -> its value under YAML 1.2's core schema (section 10.3.2 of the 1.2.2 spec).
CORE_SCHEMA = [
    ("null", None), ("Null", None), ("NULL", None), ("~", None), ("", None),
    ("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False), ("FALSE", False),
    ("0", 0), ("-0", 0), ("+12", 12), ("9223372036854775807", 2**63 - 1), ("-9223372036854775808", -(2**63)),
    ("0o17", 15), ("0o0", 0), ("0x1F", 31), ("0xff", 255), ("0x7FFFFFFFFFFFFFFF", 2**63 - 1),
    ("1.5", 1.5), ("-.5", -0.5), ("1.", 1.0), ("1e-6", 1e-6), ("1E+3", 1000.0), ("+2.5e2", 250.0), ("00.5", 0.5),
    (".inf", math.inf), ("-.Inf", -math.inf), ("+.INF", math.inf),
    # YAML 1.1 forms that are text in YAML 1.2
    ("yes", "yes"), ("No", "No"), ("on", "on"), ("OFF", "OFF"), ("y", "y"), ("1:20", "1:20"), ("1_000", "1_000"),
    ("0b101", "0b101"), ("2001-12-14", "2001-12-14"), ("nan", "nan"), ("inf", "inf"), ("0x", "0x"), ("0o8", "0o8"),
    ("1e", "1e"), (".", "."), ("tRUE", "tRUE"), ("=", "="),
]


@pytest.mark.parametrize(("text", "value"), CORE_SCHEMA)
def test_plain_scalars_follow_the_yaml12_core_schema(text, value):
    got = resolve_plain(text)
    assert got == value and type(got) is type(value)
    assert parse_yaml(f"key: {text}\n", "f")["key"] == value if text else parse_yaml("key:\n", "f")["key"] is None


@pytest.mark.parametrize("text", [".nan", ".NaN", ".NAN"])
def test_nan_is_a_float(text):
    assert math.isnan(resolve_plain(text))


@pytest.mark.parametrize("text", ["'1e-6'", '"true"', "'010'", "|\n  1:20\n", ">\n  0x10\n"])
def test_quoted_and_block_scalars_are_text(text):
    assert isinstance(parse_yaml(f"key: {text}", "f")["key"], str)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("010", "line 1, column 6: 010: a leading zero is octal in YAML 1.1 and decimal in YAML 1.2"),
        ("-007", "-007: a leading zero"),
        ("9223372036854775808", "integer out of range (objective integers fit in 64 bits)"),  # 2**63
        ("-9223372036854775809", "integer out of range"),
        ("1" * 5000, "integer out of range"),  # Python's int() itself refuses > 4300 digits
        ("0x8000000000000000", "integer out of range"),
        ("0o" + "7" * 4000, "integer out of range"),
    ],
)
def test_ambiguous_and_huge_integers_are_refused(text, problem):
    with pytest.raises(ConfigError) as info:
        parse_yaml(f"key: {text}\n", "f.yaml")
    assert problem in str(info.value)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: !!python/object/apply:os.system ['id']\n", "line 1, column 7: YAML tag '!!python/object/apply:os.system' refused"),
        ("name: !!str 1\n", "YAML tag '!!str' refused"),
        ("name: !custom x\n", "YAML tag '!custom' refused"),
        ("name: ! x\n", "YAML tag '!' refused"),
        ("masks: !!seq []\n", "YAML tag '!!seq' refused"),
        ("? [a, b]\n: 1\n", "line 1, column 3: a mapping key that is a list or a mapping: keys are field names"),
        ("? {kind: s2t}\n: 1\n", "a mapping key that is a list or a mapping"),
        ("{[a]: 1}\n", "a mapping key that is a list or a mapping"),
        ("1: x\n", "line 1, column 1: key 1 is not text: keys are field names"),
        ("null: x\n", "key None is not text"),
        ("a: &x [1]\n*x : 2\n", "line 2, column 1: key [1] is not text"),
        ("a: 1\na: 2\n", "line 2, column 1: duplicate key 'a'"),
        ("a: {b: 1, b: 2}\n", "line 1, column 11: duplicate key 'b'"),
        ("base: &b {x: 1}\nm: {<<: *b}\n", "line 2, column 5: '<<' merge keys are YAML 1.1"),
        ("a: 1\n---\na: 2\n", "line 2, column 1: a second YAML document ('---'): an objective file holds one"),
        ("a: *nowhere\n", "line 1, column 4: alias *nowhere has no anchor &nowhere before it"),
        ("a: &x [*x]\n", "line 1, column 8: alias *x refers to a value that contains it"),  # "a: &x [" is columns 1-7
        ("a: &x {b: *x}\n", "alias *x refers to a value that contains it"),
        ("a: [1, 2\n", "malformed YAML: line 2, column 1: expected ',' or ']', but got '<stream end>'"),
        ("a: b: c\n", "malformed YAML: line 1, column 5: mapping values are not allowed here"),
        ("a:\tb\x07\n", "malformed YAML: line 1, column 5: character '\\x07' is not allowed in YAML text"),
        ("a: \ud800\n", "character '\\ud800' is not allowed"),
    ],
)
def test_refused_forms_name_line_and_column(text, problem):
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    message = str(info.value)
    assert message.startswith("f.yaml: ")
    assert problem in message, message
    assert "\n" not in message


def test_quoted_merge_key_is_an_ordinary_key():
    assert parse_yaml("'<<': 1\n", "f") == {"<<": 1}


def test_anchors_and_aliases_share_values():
    data = parse_yaml("clip: &c {kind: ppo_clip, eps_low: 0.1}\nother: *c\nname: &n abc\nalso: *n\n", "f")
    assert data["other"] == {"kind": "ppo_clip", "eps_low": 0.1}
    assert data["also"] == "abc"
    objective = rlstab.load("extends: grpo\nbase: &s {kind: s2t, tau_p: 0.01}\n".replace("base: ", "masks: [") + "]\n")
    assert objective.masks[0].tau_p == 0.01


def test_an_anchor_may_be_redefined_later_and_the_last_one_wins():
    """YAML 1.2 (section 3.2.2.2): an alias refers to the most recent node with its anchor."""
    assert parse_yaml("a: &x 1\nb: &x 2\nc: *x\n", "f") == {"a": 1, "b": 2, "c": 2}


def test_an_empty_document_is_none_and_not_an_objective():
    assert parse_yaml("# only a comment\n", "f") is None
    with pytest.raises(ConfigError, match="the objective is empty"):
        rlstab.load("# nothing\n\n")


def test_no_python_object_is_ever_built(tmp_path):
    marker = tmp_path / "made"
    for text in (
        f"!!python/object/apply:os.system ['touch {marker}']",
        f"a: !!python/object/new:os.system ['touch {marker}']",
        "a: !!python/name:os.system",
        "a: !!binary aGk=",
        "a: !!set {x}",
        "a: !!timestamp 2001-12-14",
    ):
        with pytest.raises(ConfigError, match="refused"):
            parse_yaml(text, "f")
    assert not marker.exists()


TRICKY_TEXT = [
    "1e5", "0o17", "0x1F", "010", "yes", "No", "on", "1:20", ".5", ".inf", "-.INF", ".NaN", "1_000", "0b11", "~", "",
    "null", "True", "2001-12-14", "<<", "- a", "a: b", "# c", "'q'", '"', "\\", "\t", "a\nb", "\x1b[31m", "\u202e",
    "café", "\U0001f600", " lead", "trail ", "&a", "*a", "!tag", "%x", "@x", "`x", "?", "-", ":", "{", "[",
]


@pytest.mark.parametrize("text", TRICKY_TEXT)
def test_dumped_text_reads_back_as_the_same_text_in_yaml_12_and_11(text):
    dumped = dump_yaml({"name": text})
    assert parse_yaml(dumped, "f") == {"name": text}
    assert yaml.safe_load(dumped) == {"name": text}  # and PyYAML's YAML 1.1 reader agrees


@pytest.mark.parametrize("name", TRICKY_TEXT[:20])
def test_an_objective_named_like_a_number_round_trips(name):
    objective = rlstab.load({"extends": "stapo", "name": name, "description": name})
    assert rlstab.load(objective.to_yaml()) == objective
