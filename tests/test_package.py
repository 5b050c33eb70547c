"""What the wheel and the sdist carry: the package, its data, the license, the typing marker, the entry
points; and deliberately no tests (they need helpers and trainer environments the sdist cannot hold)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

BUILD = """
import sys
from setuptools import build_meta
out = sys.argv[1]
print(build_meta.build_wheel(out))
print(build_meta.build_sdist(out))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    wheel = next(line for line in lines if line.endswith(".whl"))
    sdist = next(line for line in lines if line.endswith(".tar.gz"))
    with zipfile.ZipFile(out / wheel) as z:
        wheel_files = {name: z.read(name) for name in z.namelist()}
    with tarfile.open(out / sdist) as t:
        sdist_names = [m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name]
    return wheel_files, sdist_names


def test_the_wheel_carries_the_license_typing_marker_presets_and_entry_points(built):
    wheel, _ = built
    names = set(wheel)
    assert "rlstab/py.typed" in names
    assert {f"rlstab/presets/{p.name}" for p in (ROOT / "rlstab" / "presets").glob("*.yaml")} <= names
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel[license_file] == (ROOT / "LICENSE").read_bytes()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert b"License-Expression: Apache-2.0" in wheel[metadata]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert b"[rlstab.components]" in wheel[entry_points] and b"s2t = rlstab.masks.s2t:S2T" in wheel[entry_points]
    assert not [n for n in names if n.startswith(("tests/", "examples/", "docs/"))]


def test_the_sdist_carries_the_package_and_license_and_no_tests(built):
    _, sdist = built
    assert "LICENSE" in sdist and "pyproject.toml" in sdist and "rlstab/registry/store.py" in sdist
    assert not [n for n in sdist if n.startswith(("tests/", "examples/", "docs/", "benchmarks/", "scripts/"))]
