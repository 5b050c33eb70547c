"""docs/troubleshooting.md: each block's code runs and prints (or raises) exactly what its comments show."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

PAGE = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()
BLOCKS = [text for language, text in re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S) if language == "python"]


def split(block: str) -> tuple[str, list[str]]:
    """(the code, the lines its trailing comments show)."""
    lines = block.rstrip("\n").splitlines()
    n = len(lines)
    while n and lines[n - 1].startswith("# "):
        n -= 1
    return "\n".join(lines[:n]), [line[2:] for line in lines[n:]]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_the_block_shows_what_it_does(block, monkeypatch, tmp_path):
    code, shown = split(block)
    assert shown, "a block without the output it shows"
    monkeypatch.chdir(tmp_path)
    if "without the demo extra" in code:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(code, "troubleshooting.md", "exec"), {})
        except Exception as raised:  # noqa: BLE001 - the page shows the error
            printed = [f"{type(raised).__name__}: {raised}"]
        else:
            printed = (out.getvalue() + err.getvalue()).splitlines()
    assert printed == shown
