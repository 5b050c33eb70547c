"""What the commands share (``rlstab.command_line``): without the demo extra, the commands that draw curves stop
before any work, with one line; an optional package is installed only if it can be imported."""

import importlib.util
import sys

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


def test_a_folder_of_the_same_name_is_not_the_package(tmp_path, monkeypatch):
    """A ``ray/`` folder in the working directory (Ray leaves one in the temporary folder) is a namespace package to
    ``find_spec``: ``compare --ray-address`` run from the temporary folder took it for Ray."""
    from rlstab.command_line import installed

    (tmp_path / "rlstab_absent_package").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.util.find_spec("rlstab_absent_package") is not None  # what find_spec alone says
    assert not installed("rlstab_absent_package")
    assert installed("yaml") and not installed("rlstab_no_such_module")
    monkeypatch.setitem(sys.modules, "yaml", None)  # how the tests make a package absent
    assert not installed("yaml")
