"""ConfigError messages are safe to print: one line per problem, escaped, bounded, and counted past ten."""

from __future__ import annotations

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.errors import MAX_LINE, MAX_SHOWN, count_phrase, one_line
from rlstab.loading.wording import yaml11_hint


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("bell\x07", "bell\\x07"),
        ("nul\x00", "nul\\x00"),
        ("del\x7f", "del\\x7f"),
        ("c1\x85\x9b", "c1\\x85\\x9b"),  # NEL and CSI
        ("rtl\u202etxt", "rtl\\u202etxt"),  # a right-to-left override would reverse what follows
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\u2028sep", "line\\u2028sep"),
        ("bom\ufeff", "bom\\ufeff"),
        ("lone\udce9", "lone\\udce9"),  # an undecodable byte of a file name (surrogateescape)
        ("tab\there", "tab\\there"),
        ("nbsp\xa0", "nbsp\\xa0"),
        ("unassigned\ud7fc", "unassigned\\ud7fc"),
        ("private\ue000", "private\\ue000"),
        ("plane16\U00100000", "plane16\\U00100000"),
        ("café ☕ 😀", "café ☕ 😀"),  # printable text stays as it is
    ],
)
def test_one_line_escapes_what_a_terminal_would_act_on(text, shown):
    assert one_line(text) == shown
    assert shown.isprintable()


def test_one_line_cuts_a_long_line():
    assert one_line("x" * 5000) == "x" * (MAX_LINE - 3) + "..."


def test_a_forged_error_line_stays_in_its_key():
    text = 'extends: grpo\n"x\\nforged.yaml: ok (fake)": 1\nname: "\\e]0;title\\a\\e[2J"\n'
    with pytest.raises(ConfigError) as info:
        rlstab.load(text)
    message = str(info.value)
    assert message == "<yaml text>: x\\nforged.yaml: ok (fake): unknown field (value 1); check its spelling"
    assert message.isprintable()
    objective = rlstab.load('extends: grpo\nname: "\\e[2J"\n')
    assert objective.name == "\x1b[2J"  # the value itself is kept; only messages are escaped


def test_the_source_is_escaped_too(tmp_path):
    path = tmp_path / "evil\x1b[31m\nname.yaml"
    path.write_text("extends: grpo\nmasks: [{kind: nope}]\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    assert str(info.value).startswith(str(tmp_path) + "/evil\\x1b[31m\\nname.yaml: masks[0].kind = 'nope'")
    assert "\n" not in str(info.value)


def test_after_ten_problems_the_rest_are_counted():
    masks = ", ".join(f"{{kind: s2t, bad_{i}: 1}}" for i in range(150))
    with pytest.raises(ConfigError) as info:
        rlstab.load(f"extends: grpo\nmasks: [{masks}]\n")
    err = info.value
    assert len(err.problems) == 150
    lines = str(err).splitlines()
    assert len(lines) == MAX_SHOWN + 1 == 11
    assert lines[0] == "<yaml text>: masks[0].bad_0: unknown field (value 1); check its spelling"
    assert lines[-1] == "<yaml text>: ... and 140 more problems"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("1:20", " ('1:20' is text in YAML 1.2, not a YAML 1.1 base-60 number)"),
        ("-1:30:00.5", " ('-1:30:00.5' is text in YAML 1.2, not a YAML 1.1 base-60 number)"),
        ("on", " ('on' is text in YAML 1.2, not a YAML 1.1 boolean; write true or false)"),
        ("Y", " ('Y' is text in YAML 1.2, not a YAML 1.1 boolean; write true or false)"),
        ("0b1_01", " ('0b1_01' is text in YAML 1.2, not a YAML 1.1 binary number)"),
        ("1_000.5", " ('1_000.5' is text in YAML 1.2, not a YAML 1.1 number with '_'; write it without)"),
        ("1000", ""),  # no '_': not a YAML 1.1 form
        ("_", ""),
        ("abc", ""),
        (3, ""),
    ],
)
def test_yaml11_hints(value, hint):
    assert yaml11_hint(value) == hint


def test_a_field_given_a_yaml11_form_says_why():
    with pytest.raises(ConfigError) as info:
        rlstab.load("extends: dapo\nsurrogate: {dual_clip: 1:20}\n")
    assert str(info.value) == (
        "<yaml text>: surrogate.dual_clip = '1:20': Input should be a valid number"
        " ('1:20' is text in YAML 1.2, not a YAML 1.1 base-60 number)"
    )


def test_a_count_phrase_is_plural_unless_the_count_is_one():
    assert [count_phrase(1, "seed"), count_phrase(2, "seed"), count_phrase(0, "RL step")] == ["1 seed", "2 seeds", "0 RL steps"]
