"""The flag tables of docs/demo.md, docs/audit.md and docs/lab.md list every flag of their command,
and each number flag's range as the command checks it (``rlstab.number_flags``)."""

import re
from pathlib import Path

import pytest

from rlstab.cli import build_parser
from rlstab.number_flags import allowed

DOCS = Path(__file__).parents[2] / "docs"
PAGES = {"demo": "demo.md", "audit": "audit.md", "compare": "lab.md"}


def table(page: str) -> list[tuple[str, list[str]]]:
    """``(flag, [default, allowed, what])`` per row of the page's tables headed ``| Flag | Default | Allowed | What |``
    (docs/audit.md has two: the token audit's and ``--counterfactual``'s, which repeats the flags it reads otherwise)."""
    lines = (DOCS / page).read_text().splitlines()
    starts = [i + 2 for i, line in enumerate(lines) if line == "| Flag | Default | Allowed | What |"]
    assert starts, page
    rows = []
    for start in starts:
        for line in lines[start:]:
            if not line.startswith("| `--"):
                break
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows.append((re.fullmatch(r"`(--[\w-]+)`", cells[0]).group(1), cells[1:]))
    return rows


@pytest.mark.parametrize("command", sorted(PAGES))
def test_the_table_has_every_flag_and_its_range(command):
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    numbers = parser.get_default("_number_flags")
    flags = [f for action in parser._actions for f in action.option_strings if f.startswith("--") and f != "--help"]
    rows = table(PAGES[command])
    assert sorted({flag for flag, _ in rows}) == sorted(flags)
    for flag, (_, range_text, _) in rows:
        dest = flag[2:].replace("-", "_")
        assert range_text == (allowed(*numbers[dest]) if dest in numbers else ""), flag


def test_the_pages_error_lines_are_what_the_commands_print(tmp_path, capsys):
    from rlstab.cli import main

    demo = re.split(r"exit\s+status is 2:\n\n", (DOCS / "demo.md").read_text())[1].split("\n\n")[0].splitlines()
    assert main(["demo", "--group-size", "1", "--lr", "nan", "--out", str(tmp_path)]) == 2
    assert [line.strip() for line in demo] == capsys.readouterr().err.splitlines()
    assert main(["audit", "--temperature", "nan", "--out", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"(`{line}`)" in " ".join((DOCS / "audit.md").read_text().split())
    assert not any(tmp_path.iterdir())
