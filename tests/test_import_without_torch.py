"""Validating, explaining and listing objectives imports no torch; computing a loss uses torch itself.

``rlstab validate`` runs in pre-commit hooks and editors, where importing torch would take most of
the time. Each case runs in a fresh interpreter, since this test process has imported torch long
since. Every installed plugin is loaded too: in the test environment that is the example plugin
rlstab-wreinforce, which takes torch from ``rlstab.lazy`` as the plugins page advises.
"""

from __future__ import annotations

import json
import subprocess
import sys


def run_child(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
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
import rlstab, rlstab.lazy

before = "torch" in sys.modules
loss_fn = rlstab.load("stapo").compile()
from rlstab.testing import make_batch

out = loss_fn(make_batch(loss_fn, seed=0))
out.loss.backward()
import torch
stand_ins = [f"{name}.{key}" for name, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
             for key, value in list(vars(m).items()) if type(value) is rlstab.lazy._StandIn]
print(json.dumps({
    "before": before, "finite": bool(torch.isfinite(out.loss)), "stand_ins": stand_ins,
    "ppo": sys.modules["rlstab.clipping.ppo"].torch is torch, "lazy": rlstab.lazy.torch is torch,
    "dist": sys.modules["rlstab.comm"].dist is torch.distributed,
}))
""")
    assert report["before"] is False
    assert report["finite"]
    assert report["stand_ins"] == []
    assert report["ppo"] and report["lazy"] and report["dist"]
