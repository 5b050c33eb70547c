"""Folder flags (``rlstab.path_flags``): checked with the number flags before any work, one line each, nothing created.

Issue 38 found ``--out`` under a file, unwritable or empty giving a traceback or writing on failure,
``--cache-dir`` that is a file failing after the warm start, and ``audit --out`` bad only after the
whole audit had run. Unwritable places are made so that they stop root too (tests may run as root,
whom permission bits do not stop): a path under a regular file (ENOTDIR everywhere) and, on Linux,
``/proc``; a folder without write permission is added where the tests do not run as root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import rlstab.lab.backends as backends
import rlstab.trainer.models as models
from rlstab.cli import build_parser, main
from rlstab.path_flags import check_paths, folder_flags, folder_problem

LINUX_PROC = os.path.isdir("/proc/self")
ROOT = os.geteuid() == 0


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty working folder with ``notes.txt`` (a file) and ``folder/``; loading a model or starting runs fails."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file\n")
    (tmp_path / "folder").mkdir()
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("loaded a model before checking --out"))
    monkeypatch.setattr(backends, "backend", lambda *a, **k: pytest.fail("started the runs before checking --out"))
    return tmp_path


def everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(("text", "problem"), [
    ("", "empty; name a folder"),
    ("  ", "empty; name a folder"),
    ("notes.txt", "is a file, not a folder"),
    ("notes.txt/run", "notes.txt is a file, so no folder can be made under it"),
    ("notes.txt/run/deeper", "notes.txt is a file, so no folder can be made under it"),
    ("x" * 5000, "cannot reach it: File name too long"),
    ("a\0b", "contains a NUL character"),
])
def test_why_a_folder_cannot_be_used(text, problem, here):
    assert folder_problem(text) == problem
    assert everything(here) == ["folder", "notes.txt"]


def test_a_link_to_nothing(here):
    os.symlink("nowhere", "link")
    assert folder_problem("link") == "it is a link to nothing"
    assert folder_problem("link/run") == "link is a link to nothing"


@pytest.mark.skipif(not LINUX_PROC, reason="/proc is Linux's")
def test_a_place_where_even_root_cannot_create_a_folder():
    assert folder_problem("/proc/rlstab-run") == "cannot write in /proc: No such file or directory"
    assert folder_problem("/proc") == "cannot write in it: No such file or directory"
    assert not os.path.exists("/proc/rlstab-run")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_device_is_not_a_folder():
    assert folder_problem("/dev/full") == "exists and is not a folder"
    assert folder_problem("/dev/full/run") == "/dev/full is not a folder, so no folder can be made under it"


@pytest.mark.skipif(ROOT, reason="permission bits do not stop root: the cases above stop everyone")
def test_a_folder_without_write_permission(here):
    locked = here / "locked"
    locked.mkdir(mode=0o555)
    assert folder_problem("locked") == "cannot write in it: Permission denied"
    assert folder_problem("locked/run") == "cannot write in locked: Permission denied"


def test_a_usable_folder_is_left_as_it_was(here):
    """The check creates a folder and removes it: nothing stays, in a new folder's place or in an existing one."""
    (here / "folder" / "kept.txt").write_text("x")
    for text in ("folder", "folder/new/deeper", "new", ".", str(here / "folder")):
        assert folder_problem(text) is None, text
    assert everything(here) == ["folder", "folder/kept.txt", "notes.txt"]


def test_the_commands_folder_flags():
    """Every output or cache folder of the commands is a folder flag (so a new one joins the hostile-flag table)."""
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert {name: folder_flags(p) for name, p in sub.choices.items() if folder_flags(p)} == {
        "demo": ["out", "cache_dir"], "audit": ["out", "cache_dir"], "compare": ["cache_dir", "out"]}


def test_each_bad_folder_is_one_line_naming_the_flag(here, capsys):
    args = build_parser().parse_args(["demo", "--out", "notes.txt/run", "--cache-dir", "notes.txt"])
    assert not check_paths(args, "rlstab demo")
    assert capsys.readouterr().err.splitlines() == [
        "rlstab demo: --out notes.txt/run: notes.txt is a file, so no folder can be made under it",
        "rlstab demo: --cache-dir notes.txt: is a file, not a folder",
    ]


COMMANDS = {"demo": [], "audit": [], "compare": ["--objective", "grpo"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("flag", "text", "problem"), [
    ("--out", "notes.txt", "is a file, not a folder"),
    ("--out", "notes.txt/run", "notes.txt is a file, so no folder can be made under it"),
    ("--cache-dir", "notes.txt", "is a file, not a folder"),
    ("--cache-dir", "notes.txt/cache", "notes.txt is a file, so no folder can be made under it"),
])
def test_a_bad_folder_stops_the_command_before_any_work(command, flag, text, problem, here, capsys):
    argv = [command, *COMMANDS[command], flag, text] + (["--out", "out"] if flag != "--out" else [])
    assert main(argv) == 2
    assert capsys.readouterr().err == f"rlstab {command}: {flag} {text}: {problem}\n"
    assert everything(here) == ["folder", "notes.txt"]  # no runs/demo, no out/


def test_the_default_out_is_checked_too(here, capsys):
    """``runs`` is a file here: ``rlstab demo`` without ``--out`` stops before training, naming the default."""
    (here / "runs").write_text("")
    assert main(["demo"]) == 2
    assert capsys.readouterr().err == "rlstab demo: --out runs/demo: runs is a file, so no folder can be made under it\n"


def test_bad_folders_numbers_and_inputs_are_reported_together(here, capsys):
    assert main(["demo", "--objective", "nope", "--steps", "0", "--out", "notes.txt", "--cache-dir", "notes.txt/c"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "rlstab demo: --steps 0: must be an integer from 1 to 100,000",
        "rlstab demo: --out notes.txt: is a file, not a folder",
        "rlstab demo: --cache-dir notes.txt/c: notes.txt is a file, so no folder can be made under it",
        "nope: not a preset (`rlstab presets` lists them), a .yaml file, or YAML text",
    ]


def test_audit_out_is_refused_before_the_audit_runs(here, capsys):
    """Issue 38: a bad ``audit --out`` failed only when the report was written, after sampling and auditing."""
    assert main(["audit", "--out", "notes.txt"]) == 2  # load_policy fails the test (the fixture): no sampling
    assert capsys.readouterr().err == "rlstab audit: --out notes.txt: is a file, not a folder\n"
