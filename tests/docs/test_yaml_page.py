"""docs/yaml.md is checked, block by block: its YAML loads, its console output is what the commands print,
its YAML 1.2 and limits tables say what the loader does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rlstab
from rlstab.cli import main
from rlstab.expression import MAX_DEPTH, MAX_LENGTH
from rlstab.loading import LIMITS
from rlstab.presets import preset_path

PAGE = (Path(__file__).parents[2] / "docs" / "yaml.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S)

# The small files behind "Other messages, each from a small file" (their file name starts each line).
SMALL_FILES = {
    "dup.yaml": "extends: dapo\nname: a\nname: b\n",
    "tag.yaml": "extends: dapo\nname: !!python/object:os.system {}\n",
    "ext.yaml": "extends: grpo-typo\n",
    "cyc1.yaml": "extends: cyc2.yaml\n",
    "cyc2.yaml": "extends: cyc1.yaml\n",
    "noagg.yaml": "name: x\nmasks: []\n",
    "nokind.yaml": "extends: stapo\nmasks:\n  - {tau_p: 0.1}\n",
    "yes.yaml": "extends: stare\nreweighters: [{kind: stare, adaptive: yes}]\n",
    "octal.yaml": "extends: grpo\nlog_ratio_clamp: 010\n",
    "deep.yaml": "a: " + "[" * 40 + "]" * 40 + "\n",
    "bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    + "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    + "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
    "dapo-s2t.yaml": "extends: dapo\nname: dapo-s2t\nmasks: [{kind: s2t}]\n",
}
VALIDATED = {"cyc2.yaml": "cyc1.yaml"}  # the error names the file whose extends closes the cycle
SMALL_BYTES = {"latin1.yaml": "extends: grpo\nname: café\n".encode("latin-1")}


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in SMALL_FILES.items():
        (tmp_path / name).write_text(text)
    for name, data in SMALL_BYTES.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def console(command: str) -> list[str]:
    """The lines a console block of the page shows after ``$ command``."""
    for language, text in BLOCKS:
        if language == "console" and text.startswith(f"$ {command}\n"):
            return text.splitlines()[1:]
    raise AssertionError(f"no console block for {command!r}")


def validate(capsys, *names: str) -> tuple[int, list[str], list[str]]:
    code = main(["validate", *names])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_every_yaml_block_loads_but_the_bad_example():
    bad = [text for language, text in BLOCKS if language == "yaml" and "entropy_quantil:" in text]
    assert len(bad) == 1
    loaded = 0
    for language, text in BLOCKS:
        if language == "yaml" and text not in bad:
            assert isinstance(rlstab.load(text), rlstab.Objective), text
            loaded += 1
    assert loaded >= 4


def test_the_bad_file_prints_what_the_page_shows(files, capsys):
    (bad,) = [text for language, text in BLOCKS if language == "yaml" and "entropy_quantil:" in text]
    (files / "bad.yaml").write_text(bad)
    code, out, err = validate(capsys, "bad.yaml")
    assert (code, out) == (1, [])
    assert err == console("rlstab validate bad.yaml")


def test_the_other_messages_are_what_the_small_files_print(files, capsys):
    lines = [line for language, text in BLOCKS if language == "console" and "dup.yaml:" in text for line in text.splitlines()]
    assert lines
    for line in lines:
        name = line.split(":", 1)[0]
        code, out, err = validate(capsys, VALIDATED.get(name, name))
        assert (code, out, err) == (1, [], [line])


def test_validate_of_a_good_and_a_bad_file(files, capsys):
    (bad,) = [text for language, text in BLOCKS if language == "yaml" and "entropy_quantil:" in text]
    (files / "bad.yaml").write_text(bad)
    shown = console("rlstab validate dapo-s2t.yaml bad.yaml")
    assert shown[-1] == "..."
    code, out, err = validate(capsys, "dapo-s2t.yaml", "bad.yaml")
    assert code == 1
    assert (out + err)[: len(shown) - 1] == shown[:-1]


def test_presets_output(capsys):
    assert main(["presets"]) == 0
    assert capsys.readouterr().out.splitlines() == console("rlstab presets")


def test_the_subcommands_named_are_the_commands_there_are():
    import argparse

    from rlstab.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    section = PAGE.split("## The `rlstab` command\n\n", 1)[1].split("\n\n", 1)[0]
    named = re.findall(r"`(\w+)`", section)
    assert sorted(named) == sorted(sub.choices), section


def table(heading: str) -> list[list[str]]:
    """The body rows of the first table under ``## heading``, as stripped cells."""
    lines = PAGE.split(f"## {heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 2 : end]]


# What rlstab reads for each "Written" cell of the YAML 1.2 table: a value, or a fragment of the refusal.
YAML12 = {
    "`1e-6`": ("log_ratio_clamp", 1e-6),
    "`1:20`": ("log_ratio_clamp", "'1:20' is text in YAML 1.2, not a YAML 1.1 base-60 number"),
    "`yes`, `no`, `on`, `off`, `y`, `n`": ("adaptive", "is text in YAML 1.2, not a YAML 1.1 boolean; write true or false"),
    "`1_000`": ("log_ratio_clamp", "'1_000' is text in YAML 1.2, not a YAML 1.1 number with '_'"),
    "`0b101`": ("log_ratio_clamp", "'0b101' is text in YAML 1.2, not a YAML 1.1 binary number"),
    "`0o17`": ("log_ratio_clamp", 15.0),
    "`010`": ("log_ratio_clamp", "010: a leading zero is octal in YAML 1.1 and decimal in YAML 1.2"),
    "`<<: *base`": (None, "'<<' merge keys are YAML 1.1, and objectives are YAML 1.2: use extends:"),
}


def test_the_yaml12_table_is_what_the_loader_does():
    rows = table("YAML 1.2")
    assert [row[0] for row in rows] == list(YAML12)
    for written, (field, expected) in YAML12.items():
        for literal in re.findall(r"`([^`]+)`", written):
            if field is None:
                text = f"extends: grpo\nbase: &base {{eps: 0.1}}\nadvantage: {{kind: grpo, {literal}}}\n"
            elif field == "adaptive":
                text = f"extends: stare\nreweighters: [{{kind: stare, adaptive: {literal}}}]\n"
            else:
                text = f"extends: grpo\n{field}: {literal}\n"
            if isinstance(expected, float):
                assert rlstab.load(text).log_ratio_clamp == expected, literal
            else:
                with pytest.raises(rlstab.ConfigError) as info:
                    rlstab.load(text)
                assert expected in str(info.value), (literal, str(info.value))


def test_the_limits_table_is_what_the_loader_enforces():
    rows = table("Limits")
    expected = {
        "size of an objective": LIMITS.bytes,
        "objectives in one `extends:` chain": LIMITS.extends,
        "nesting of mappings and lists": LIMITS.depth,
        "keys of one mapping": LIMITS.keys,
        "items of one list": LIMITS.items,
        "values (scalars, mappings, lists)": LIMITS.values,
        "length of an [expression]": MAX_LENGTH,
        "nesting of an expression": MAX_DEPTH,
    }
    assert len(rows) == len(expected)
    for (label, value), (start, limit) in zip(rows, expected.items()):
        assert label.startswith(start), (label, start)
        assert int(re.match(r"[\d,]+", value).group().replace(",", "")) == limit, (label, value)
    assert "every preset is under 1 KB" in PAGE
    assert max(preset_path(name).stat().st_size for name in rlstab.preset_names()) < 1024


def test_the_lists_section_shows_what_validate_and_explain_print(files, capsys):
    """The replacing file of "Lists of components": validate's note (exit 0) and explain's line; the appending one."""
    (replacing,) = [text for language, text in BLOCKS if language == "yaml" and "masks: [{kind: entropy_quantile" in text]
    (appending,) = [text for language, text in BLOCKS if language == "yaml" and "  append:\n" in text]
    (files / "stapo-eq.yaml").write_text(replacing)
    code, out, err = validate(capsys, "stapo-eq.yaml")
    assert (code, out, err) == (0, console("rlstab validate stapo-eq.yaml"), [])
    assert main(["explain", "stapo-eq.yaml"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == out[1]
    kept = rlstab.load(appending)
    assert [m.kind for m in kept.masks] == ["s2t", "entropy_quantile"] and kept.dropped == ()
