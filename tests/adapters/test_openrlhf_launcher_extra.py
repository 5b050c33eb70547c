"""``python -m rlstab.adapters.openrlhf`` without OpenRLHF installed: one line saying what to install, status 2.

Issue 38: the launcher answered ``ModuleNotFoundError: ray``. These tests run in the main suite (the
launcher's other tests need OpenRLHF: tests/adapters/openrlhf), and make OpenRLHF and Ray absent
themselves, by a ``None`` entry in ``sys.modules``, so they hold where both are installed too.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlstab.adapters.openrlhf import launcher
from rlstab.adapters.openrlhf.launcher import main

OPENRLHF_ARGS = ["--actor.model_name_or_path", "Qwen/Qwen3-8B-Base", "--reward.remote_url", "/r.py"]
WITHOUT = """
import runpy, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed
sys.argv = ["python -m rlstab.adapters.openrlhf", *sys.argv[2:]]
runpy.run_module("rlstab.adapters.openrlhf", run_name="__main__", alter_sys=True)
"""


def test_the_launcher_without_openrlhf_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "openrlhf", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit) as exit_:
        main(["--objective", "grpo", *OPENRLHF_ARGS])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "rlstab: the OpenRLHF launcher needs openrlhf and ray, not installed here: pip install 'rlstab[openrlhf]'\n")


@pytest.mark.parametrize("absent", ["openrlhf", "ray"])
def test_the_launcher_names_the_one_missing(absent, monkeypatch, capsys):
    monkeypatch.setattr(launcher, "installed", lambda module: module != absent)
    with pytest.raises(SystemExit) as exit_:
        main(["--objective", "grpo", *OPENRLHF_ARGS])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"rlstab: the OpenRLHF launcher needs {absent}, not installed here: pip install 'rlstab[openrlhf]'\n")


def test_python_m_without_openrlhf_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT, "openrlhf,ray", "--objective", "stapo", *OPENRLHF_ARGS],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "rlstab: the OpenRLHF launcher needs openrlhf and ray, not installed here: pip install 'rlstab[openrlhf]'\n"


def test_a_bad_objective_is_still_named_first(monkeypatch, capsys):
    """The objective is checked before the extra: a user without OpenRLHF still learns what is wrong with it."""
    monkeypatch.setitem(sys.modules, "openrlhf", None)
    with pytest.raises(SystemExit):
        main(["--objective", "stapoo", *OPENRLHF_ARGS])
    assert capsys.readouterr().err.startswith("rlstab: --objective: 'stapoo': neither a preset")
