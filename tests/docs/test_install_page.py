"""docs/install.md says what the set-up scripts and the package declare: its pip commands are the
scripts' own, its extras table is the installed package's extras with their pins; the changelog's
version is the package's."""

from __future__ import annotations

import re
from importlib.metadata import metadata, requires
from pathlib import Path

import rlstab

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "docs" / "install.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S)
SCRIPTS = "\n".join(p.read_text() for p in (ROOT / "scripts").glob("*.sh"))


def _pip_arguments(line: str) -> list[str]:
    """The packages of a ``pip install`` line, flags and environment prefix left out."""
    words = line.split("#")[0].split()
    words = words[words.index("install") + 1 :]
    return [w for w in words if not w.startswith("-") or w == "-e"]


def test_every_command_is_one_the_scripts_run():
    commands = [line for language, text in BLOCKS if language == "bash" for line in text.splitlines()]
    assert commands
    scripts_pip = [_pip_arguments(line) for line in SCRIPTS.splitlines() if "pip install" in line]
    for command in commands:
        if command.startswith("bash "):
            assert (ROOT / command.split()[1]).is_file(), command
        else:
            assert command.startswith("pip install"), command
            assert _pip_arguments(command) in scripts_pip, command


def test_the_extras_table_is_pyprojects():
    rows = [line for line in PAGE.split("## Extras")[1].split("\n\n")[1].splitlines()[2:]]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    extras = metadata("rlstab").get_all("Provides-Extra")
    assert [c[0].strip("`") for c in cells] == extras
    for name, _, pins in cells:
        marker = f'extra == "{name.strip("`")}"'
        pinned = [r.split(";")[0].strip() for r in requires("rlstab") if marker in r]
        wanted = sorted(r for r in pinned if "==" in r)
        assert sorted(re.findall(r"`([^`]+==[^`]+)`", pins)) == wanted, name


def test_the_changelog_names_the_packages_version():
    changelog = (ROOT / "docs" / "changelog.md").read_text()
    assert re.search(r"^## (\S+)", changelog, flags=re.M).group(1) == rlstab.__version__


def test_every_page_states_the_python_pyproject_requires():
    """README and install.md name pyproject's lowest Python, and the one the set-up scripts test on."""
    lowest = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    tested = re.search(r"command -v python(3\.\d+)", SCRIPTS).group(1)
    readme = (ROOT / "README.md").read_text()
    assert f"Python {lowest} or later (tested on {tested})" in readme
    assert f"Python {lowest} or later (it is developed and tested on {tested})" in PAGE
    for text in (readme, PAGE):  # no other Python version claimed
        assert set(re.findall(r"Python (3\.\d+)", text)) <= {lowest, tested}
