"""docs/plugins.md is checked block by block: the example plugin's files shown verbatim, the listing
as ``rlstab components`` prints it, the families table as the registry holds it, the kit's example run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from rlstab.cli import main
from rlstab.registry import FAMILIES

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "docs" / "plugins.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S)


def test_the_example_files_are_shown_verbatim():
    shown = [(text.split("\n", 1)) for _, text in BLOCKS if text.startswith("# examples/")]
    assert len(shown) == 2
    for first, rest in shown:
        path = ROOT / first.removeprefix("# ")
        assert rest == path.read_text(), path


def test_the_entry_point_block_is_the_plugins_declaration():
    (toml,) = [text for language, text in BLOCKS if language == "toml"]
    assert toml in (ROOT / "examples" / "rlstab-vespo" / "pyproject.toml").read_text()


def test_the_listing_is_what_rlstab_components_prints(capsys):
    (console,) = [text for language, text in BLOCKS if language == "console"]
    command, *lines = console.splitlines()
    assert main(command.removeprefix("$ rlstab ").split()) == 0
    assert capsys.readouterr().out.splitlines() == lines


def test_the_families_table_is_the_registry():
    table = PAGE.split("## Families")[1].split("\n\n")[1].splitlines()[2:]
    rows = [[cell.strip().strip("`") for cell in line.split("|")[1:-1]] for line in table]
    assert [row[0] for row in rows] == list(FAMILIES)
    for field, base, _, runs in rows:
        module, name = base.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is FAMILIES[field].base, field
        assert runs == FAMILIES[field].scope, field


def test_the_kit_example_runs():
    (code,) = [text for language, text in BLOCKS if language == "python" and "check_component" in text]
    namespace: dict = {}
    exec(compile(code, "plugins.md", "exec"), namespace)
    namespace["test_vespo_passes_the_kit"]()
