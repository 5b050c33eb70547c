"""Without the demo extra, the commands that draw curves stop before any work, with one line."""

import importlib.util

import pytest

from rlstab.cli import main


@pytest.mark.parametrize("command, arguments", [("demo", []), ("audit", []), ("compare", ["--objective", "grpo"])])
def test_a_missing_matplotlib_stops_the_command_before_it_trains(command, arguments, monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    out = tmp_path / "out"
    assert main([command, *arguments, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"rlstab {command}: its curves need matplotlib, which is not installed: pip install 'rlstab[demo]'\n"
    )
    assert not out.exists()  # nothing trained, nothing written
