"""Installed distributions made on disk for the registry's tests: a module and a ``.dist-info`` folder.

A ``.dist-info`` folder with ``METADATA`` and ``entry_points.txt`` on ``sys.path`` is what pip leaves
behind; ``importlib.metadata`` finds it exactly as it finds a pip-installed package. The tests run
Python in a subprocess with such a folder on ``PYTHONPATH``, so every process starts with a fresh
registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RATIO_CAP = '''
from typing import Literal

from pydantic import Field

from rlstab.masks import Mask


class RatioCap(Mask):
    """Keep a token only while its importance ratio r is at most ``cap``."""

    kind: Literal["ratio_cap"] = "ratio_cap"
    cap: float = Field(2.0, gt=1.0)

    def keep(self, t, threshold=None):
        return (t.ratio <= self.cap).to(t.ratio.dtype)

    def describe(self):
        return f"ratio_cap: keep tokens with r <= {self.cap:g}"
'''


def make_dist(root: Path, name: str, entry_points: dict[str, str], modules: dict[str, str], version: str = "1.0") -> None:
    """Write modules ``{module: source}`` and a distribution ``name`` declaring ``entry_points`` in rlstab.components."""
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[rlstab.components]\n{lines}")


def run_python(root: Path, code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` with ``root`` on the path, as a fresh process (warnings printed by default)."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    environ.pop("RLSTAB_IN_PROCESS_KINDS", None)  # as a process started by a user, unless the test says otherwise
    environ.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environ, timeout=120)


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return run_python(root, "import sys; from rlstab.cli import main; sys.exit(main(sys.argv[1:]))", *args)
