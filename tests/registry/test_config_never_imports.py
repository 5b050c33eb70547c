"""A config can only pick among registered kinds: a string naming ``os.system`` anywhere does nothing.

Every field of every registered kind (and ``kind``, ``extends``, ``name``, ``description``) is set to
strings that name callables; loading must neither call nor import anything they name. Calls are
caught by replacing ``os.system`` and ``subprocess.Popen``, imports by recording ``__import__``
(``exec`` and ``eval`` stay: the import system itself runs module code with ``exec``).
"""

from __future__ import annotations

import builtins
import os
import subprocess
import sys

import pytest

import rlstab
from rlstab.registry import registrations

HOSTILE = ["os.system", "os:system", "os.system('touch pwned')", "__import__('os').system('x')", "!!python/object/apply:os.system ['x']"]


def hostile_documents():
    for value in HOSTILE:
        yield {"extends": value}
        yield {"name": value, "description": value, "extends": "grpo"}
        yield {"extends": "grpo", "masks": [{"kind": value}]}
        for reg in registrations():
            fields = dict.fromkeys(reg.cls.model_fields, value)
            fields["kind"] = reg.kind
            part = [fields] if reg.family in ("masks", "reweighters", "regularisers", "reward_shaping") else fields
            yield {"extends": "grpo", reg.family: part}
    yield "extends: grpo\nsurrogate: !!python/object/apply:os.system ['touch pwned']\n"
    yield "!!python/name:os.system\n"


@pytest.fixture
def forbidden(tmp_path, monkeypatch):
    calls, imported = [], []

    def refuse(name):
        return lambda *a, **k: calls.append((name, a))

    monkeypatch.setattr(os, "system", refuse("os.system"))
    monkeypatch.setattr(subprocess, "Popen", refuse("subprocess.Popen"))
    real_import = builtins.__import__

    def recording_import(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", recording_import)
    return calls, imported


def test_no_string_in_a_config_is_imported_or_executed(tmp_path, monkeypatch, forbidden):
    monkeypatch.chdir(tmp_path)
    rlstab.load("grpo")  # warm: lazy imports of rlstab itself happen here, not below
    modules = set(sys.modules)
    calls, imported = forbidden
    outcomes = {"loaded": 0, "refused": 0}
    for document in hostile_documents():
        try:
            rlstab.load(document)
            outcomes["loaded"] += 1
        except rlstab.ConfigError as err:
            assert all("\n" not in p for p in err.problems)
            outcomes["refused"] += 1
    assert calls == []
    assert not [name for name in imported if "system" in name or name.startswith(("os.", "subprocess"))]
    assert set(sys.modules) - modules == set()
    assert not (tmp_path / "pwned").exists()
    # Name and description are free text, and a kind without fields has nothing to set: those documents
    # load; every other one is refused.
    fieldless = sum(set(reg.cls.model_fields) == {"kind"} for reg in registrations())
    assert outcomes["loaded"] == len(HOSTILE) * (1 + fieldless) and outcomes["refused"] > 30 * len(HOSTILE)
