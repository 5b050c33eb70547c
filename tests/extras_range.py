"""The trainer extras are ranges: installing ``rlstab[<trainer>]`` leaves an in-range trainer where it is.

Each trainer's test environment holds the release CI tests (verl 0.9.1, trl 1.16.0, openrlhf
0.11.2). [`installed_trainer_stays`][] makes a throw-away environment that sees every package of
that environment (through a ``.pth`` file) but may hold another in-range release of the trainer
itself, installed from its wheel (``scripts/test.sh`` downloads them into ``.wheels/in-range``).
It then asks pip, offline and against the installed packages only (``--no-index``, ``--isolated``:
no index, no find-links), what installing ``rlstab[<extra>]`` would do: install rlstab, and
nothing else. For another release, the same question for an exact pin of the tested release is
refused, so the check can tell a range from a pin.

OpenRLHF's test environment installs it with ``--no-deps`` (its flash-attn and vLLM pins build
only against CUDA), so pip cannot resolve its tree offline there: ``whole_tree=False`` asks pip for
rlstab alone (``--no-deps``) and checks the requirement pip would apply against the installed
release, which is the test pip makes before it leaves an installed package alone.
"""

from __future__ import annotations

import json
import site
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".wheels" / "in-range"
PIP = ["-m", "pip", "--isolated", "--disable-pip-version-check"]


def installed_trainer_stays(
    extra: str, dist: str, version: str, tested: str, tmp_path: Path, *, whole_tree: bool = True
) -> Requirement:
    """Asserts that ``pip install rlstab[extra]`` next to ``dist==version`` installs rlstab alone; returns the requirement.

    ``version == tested``: the trainer's own environment, no other release installed.
    """
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    own = next((env / "lib").glob("python*/site-packages"))
    visible = "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages())
    (own / "zz_trainer_environment.pth").write_text(f"import site; {visible}\n")
    python = str(env / "bin" / "python")
    if version != tested:
        wheel = next(WHEELS.glob(f"{dist}-{version}-*.whl"), None)
        assert wheel is not None, (
            f"no {dist}=={version} wheel in .wheels/in-range: scripts/test.sh downloads it "
            f"(pip download --no-deps {dist}=={version} -d .wheels/in-range)"
        )
        subprocess.run([python, *PIP, "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    found = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert found == version, f"the throw-away environment holds {dist} {found}, not {version}"

    report = tmp_path / "report.json"
    done = subprocess.run(
        [python, *PIP, "install", "--dry-run", "--no-index", "--no-build-isolation", "-q",
         *([] if whole_tree else ["--no-deps"]), "--report", str(report), f"{REPO}[{extra}]"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, f"pip cannot install rlstab[{extra}] next to {dist} {version}:\n{done.stderr[-3000:]}"
    (rlstab,) = json.loads(report.read_text())["install"]  # rlstab alone: nothing else installed or moved
    assert rlstab["metadata"]["name"] == "rlstab"
    requirement = next(
        r for r in map(Requirement, rlstab["metadata"]["requires_dist"]) if r.name == dist and r.marker is not None
    )
    assert requirement.specifier.contains(version) and requirement.specifier.contains(tested)

    if version != tested and not whole_tree:
        assert not Requirement(f"{dist}=={tested}").specifier.contains(version)
    elif version != tested:
        pinned = subprocess.run(
            [python, *PIP, "install", "--dry-run", "--no-index", "-q", f"{dist}=={tested}"], capture_output=True, text=True
        )
        assert pinned.returncode != 0, f"{dist}=={tested} resolved offline: the check cannot tell a pin from a range"
    return requirement
