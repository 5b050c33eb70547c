"""Validating, explaining and listing objectives imports no torch; computing a loss uses torch itself.

``rlstab validate`` runs in pre-commit hooks and editors, where importing torch would take most of
the time. Each case runs in a fresh interpreter, since this test process has imported torch long
since. The example plugin rlstab-vespo, installed in the test environment, imports torch itself (a
plugin's choice): the child loads only rlstab's own entry points, so what is tested is rlstab's path.
"""

from __future__ import annotations

import json
import subprocess
import sys

ONLY_RLSTAB_ENTRY_POINTS = """
from importlib import metadata
_all = metadata.entry_points
metadata.entry_points = lambda **kw: [ep for ep in _all(**kw) if ep.dist is None or ep.dist.metadata["Name"] == "rlstab"]
"""


def run_child(code: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", ONLY_RLSTAB_ENTRY_POINTS + code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_validate_explain_presets_schema_import_no_torch():
    report = run_child("""
import contextlib, io, json, sys
import rlstab
from rlstab.cli import _load_or_report, main

names = rlstab.preset_names()
loaded = [_load_or_report(name) is not None for name in names]  # the validate command's loading
codes = []
with contextlib.redirect_stdout(io.StringIO()):
    codes.append(main(["validate", *names]))
    codes += [main(["explain", name]) for name in names]
    codes.append(main(["presets"]))
    codes.append(main(["schema"]))
    try:
        main(["--version"])
    except SystemExit as exit:
        codes.append(exit.code)
torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps({"presets": len(names), "loaded": all(loaded), "codes": codes, "torch": torch}))
""")
    assert report["presets"] >= 20 and report["loaded"]
    assert report["codes"] == [0] * len(report["codes"])
    assert report["torch"] == [], "validating imported torch"


def test_a_loss_uses_torch_itself_once_imported():
    """After the first loss, every module holds torch itself: no stand-in between a loss and torch."""
    report = run_child("""
import json, sys, types
import rlstab, rlstab._torch

before = "torch" in sys.modules
loss_fn = rlstab.load("stapo").compile()
from rlstab.testing import make_batch

out = loss_fn(make_batch(loss_fn, seed=0))
out.loss.backward()
import torch
stand_ins = [f"{name}.{key}" for name, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
             for key, value in list(vars(m).items()) if type(value) is rlstab._torch._StandIn]
print(json.dumps({
    "before": before, "finite": bool(torch.isfinite(out.loss)), "stand_ins": stand_ins,
    "ppo": sys.modules["rlstab.clipping.ppo"].torch is torch, "lazy": rlstab._torch.torch is torch,
    "dist": sys.modules["rlstab.comm"].dist is torch.distributed,
}))
""")
    assert report["before"] is False
    assert report["finite"]
    assert report["stand_ins"] == []
    assert report["ppo"] and report["lazy"] and report["dist"]
