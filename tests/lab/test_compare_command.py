"""``rlstab compare``'s Ray flags: refused before the output folder is created, one line each.

Issue 38: ``--ray-address`` without Ray installed failed after ``--out`` was created, and
``--workers`` with it was ignored silently. With Ray each run is a task asking for one CPU and the
cluster decides how many run at once, so ``--workers`` (local processes) cannot apply: the two are
refused together.
"""

from __future__ import annotations

import importlib
import sys

import pytest

import rlstab.lab.backends as backends
from rlstab.cli import main

compare_command = importlib.import_module("rlstab.lab.compare_command")
lab_compare = importlib.import_module("rlstab.lab.compare")  # the module: ``rlstab.lab.compare`` is also its function
GRID = ["compare", "--objective", "grpo", "--seeds", "1", "--steps", "1"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(backends, "backend", lambda *a, **k: pytest.fail("started the runs"))
    return tmp_path


def test_ray_address_without_ray_is_refused_before_out_is_created(here, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed, wherever this runs
    assert main([*GRID, "--ray-address", "auto", "--out", "out"]) == 2
    assert capsys.readouterr().err == (
        "rlstab compare: --ray-address needs Ray, which is not installed: pip install 'rlstab[ray]'\n")
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("workers", ["1", "4"])
def test_workers_with_a_ray_address_is_refused(workers, here, monkeypatch, capsys):
    monkeypatch.setattr(compare_command, "installed", lambda module: True)
    assert main([*GRID, "--ray-address", "auto", "--workers", workers, "--out", "out"]) == 2
    assert capsys.readouterr().err == (
        f"rlstab compare: --workers {workers} and --ray-address auto: with Ray each run is a task asking for one CPU "
        "and the cluster sets how many run at once; give one of the two\n")
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("address", ["nope", "host", "host:port", "a b:1", "host:123456", "http//x:1"])
def test_a_ray_address_of_no_known_form_is_refused(address, here, monkeypatch, capsys):
    monkeypatch.setattr(compare_command, "installed", lambda module: True)
    assert main([*GRID, "--ray-address", address, "--out", "out"]) == 2
    assert capsys.readouterr().err.endswith(": must be auto, local, HOST:PORT or ray://HOST:PORT\n")
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("address", ["auto", "local", "10.0.0.1:6379", "head-node:6379", "[::1]:6379",
                                     "ray://head:10001"])
def test_the_addresses_ray_takes_reach_the_grid(address, here, monkeypatch):
    monkeypatch.setattr(compare_command, "installed", lambda module: True)
    calls = []
    monkeypatch.setattr(lab_compare, "compare", lambda *a, **k: calls.append(k) or {"runs": [], "settings": {"pairs": {}}})
    assert main([*GRID, "--ray-address", address, "--out", "out"]) == 0
    assert [(k["ray_address"], k["workers"]) for k in calls] == [(address, None)]


def test_with_ray_the_cache_dir_is_the_workers_and_not_checked_here(here, monkeypatch, capsys):
    (here / "notes.txt").write_text("")
    monkeypatch.setattr(compare_command, "installed", lambda module: True)
    monkeypatch.setattr(lab_compare, "compare", lambda *a, **k: {"runs": [], "settings": {"pairs": {}}})
    assert main([*GRID, "--ray-address", "auto", "--cache-dir", "notes.txt/cache", "--out", "out"]) == 0
    assert main([*GRID, "--cache-dir", "notes.txt/cache", "--out", "out"]) == 2  # without Ray, the same is refused
    assert capsys.readouterr().err == (
        "rlstab compare: --cache-dir notes.txt/cache: notes.txt is a file, so no folder can be made under it\n")
