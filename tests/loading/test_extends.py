"""The ``extends:`` chain within its limits: length, total size, cycles, and a chain deeper than Python's stack."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.explain import explain
from rlstab.loading import LIMITS
from rlstab.presets import preset_path

ROOT = "aggregation: {kind: token-mean, count: valid}\n"


def chain(directory, n: int) -> str:
    """Files f0.yaml .. f{n-1}.yaml in ``directory``, each extending the next but the last. Returns f0's path."""
    directory.mkdir(exist_ok=True)
    for i in range(n - 1):
        (directory / f"f{i}.yaml").write_text(f"extends: f{i + 1}.yaml\nname: f{i}\n")
    (directory / f"f{n - 1}.yaml").write_text(ROOT)
    return str(directory / "f0.yaml")


def test_a_chain_at_the_limit_loads_and_one_longer_is_refused(tmp_path):
    assert rlstab.load(chain(tmp_path / "at", LIMITS.extends)).aggregation.count == "valid"  # f0 .. f31
    first = chain(tmp_path / "past", LIMITS.extends + 1)
    with pytest.raises(ConfigError) as info:
        rlstab.load(first)
    assert str(info.value) == f"{first}: extends: a chain of more than 32 objectives (the limit on extends), at 'f32.yaml'"


def test_a_chain_longer_than_the_python_stack_is_refused_at_the_limit(tmp_path):
    first = chain(tmp_path / "long", 1500)
    with pytest.raises(ConfigError) as info:
        rlstab.load(first)
    assert str(info.value) == f"{first}: extends: a chain of more than 32 objectives (the limit on extends), at 'f32.yaml'"


def test_the_size_limit_counts_every_file_of_the_chain(tmp_path):
    half = LIMITS.bytes // 2
    (tmp_path / "base.yaml").write_text("extends: dapo\n" + "#" * half + "\n")  # 14 + 131,072 + 1 = 131,087 bytes
    (tmp_path / "child.yaml").write_text("extends: base.yaml\n" + "#" * (half - 100) + "\n")  # 19 + 130,972 + 1 = 130,992
    # child leaves 262,144 - 130,992 = 131,152 bytes; base takes 131,087 of them, leaving 65 for dapo, which is larger
    dapo = preset_path("dapo").stat().st_size
    assert dapo > 65
    with pytest.raises(ConfigError) as info:
        rlstab.load(tmp_path / "child.yaml")
    assert str(info.value) == (
        f"preset dapo: {dapo:,} bytes, but the files that extend it leave only 65 of the 262,144 an objective may have "
        "(the limit on objective size counts every file of an extends chain)"
    )
    (tmp_path / "small.yaml").write_text("extends: base.yaml\n")
    assert rlstab.load(tmp_path / "small.yaml").surrogate == rlstab.load("dapo").surrogate


def test_a_cycle_anywhere_in_the_chain_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: c.yaml\n")
    (tmp_path / "c.yaml").write_text("extends: ./b.yaml\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(tmp_path / "a.yaml")
    a, b, c = (str(tmp_path / f"{n}.yaml") for n in "abc")
    assert str(info.value) == f"{c}: extends = './b.yaml': circular ({a} -> {b} -> {c} -> {b})"


def test_a_derived_objective_does_not_take_its_parents_name_and_explain_names_its_file(tmp_path, capsys):
    from rlstab.cli import main

    parent = rlstab.load("dapo")
    assert parent.name == "dapo" and parent.description
    path = tmp_path / "wider.yaml"
    path.write_text("extends: dapo\nsurrogate: {eps_high: 0.3}\n")
    derived = rlstab.load(path)
    assert (derived.name, derived.description) == (None, None)
    assert derived.surrogate.eps_high == 0.3 and derived.surrogate.eps_low == parent.surrogate.eps_low
    assert main(["explain", str(path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{path} (no name: set `name:` and `description:`")
    assert explain(derived).startswith("objective (no name:")  # from Python, without a source
    named = rlstab.load("extends: dapo\nname: wider\ndescription: dapo with eps_high 0.3\n")
    assert explain(named).splitlines()[:2] == ["wider", "  dapo with eps_high 0.3"]


def test_the_yaml_page_says_what_extends_does_with_the_name():
    page = (Path(__file__).parents[2] / "docs" / "yaml.md").read_text()
    assert "does not inherit its `name` and\n`description`" in page
    assert "inherits its `name`" not in page
