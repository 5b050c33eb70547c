"""docs/expressions.md's Errors section is what rlstab prints: the file's one-line problem, and the caret drawing."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from rlstab.cli import main

SECTION = (Path(__file__).parents[2] / "docs" / "expressions.md").read_text().split("## Errors\n", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", SECTION, flags=re.S)


def block(language: str) -> str:
    (text,) = [text for lang, text in BLOCKS if lang == language]
    return text


def test_the_file_prints_the_line_the_page_shows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("config.yaml").write_text(block("yaml"))
    command, *shown = block("console").splitlines()
    assert command == "$ rlstab validate config.yaml"
    assert main(["validate", "config.yaml"]) == 1
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == ("", shown)


def test_the_python_block_prints_the_caret_drawing():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block("python"), "expressions.md", "exec"), {})  # the page's own code, as a reader runs it
    assert printed.getvalue() == block("text")
