"""The documentation site, built once per test session by the command CI runs (read from scripts/test.sh)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TEST_SCRIPT = ROOT / "scripts" / "test.sh"


@pytest.fixture(scope="session")
def ci_docs_command() -> tuple[dict[str, str], list[str]]:
    """scripts/test.sh's ``mkdocs build`` line as ``(environment, argv)``, with ``$site`` left in ``argv``.

    The line's own mkdocs (``.venv-test/bin/mkdocs``) becomes ``python -m mkdocs`` of the running
    interpreter: the same mkdocs, from the environment the tests run in.
    """
    (line,) = [line for line in TEST_SCRIPT.read_text().splitlines() if re.search(r"\bmkdocs build\b", line)]
    words = shlex.split(line)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[0].rsplit("/", 1)[-1] == "mkdocs", line
    argv = [sys.executable, "-m", "mkdocs", *words[1:]]
    assert [word for word in argv if "$" in word] == ["$site"], f"{line}: a shell variable other than $site"
    return env, argv


@pytest.fixture(scope="session")
def ci_docs_build(ci_docs_command) -> Callable[[Path, Path], subprocess.CompletedProcess]:
    """``build(project, site)``: CI's docs command run in the folder ``project``, writing the site to ``site``."""
    env, argv = ci_docs_command

    def build(project: Path, site: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(site) if word == "$site" else word for word in argv],
            cwd=project,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )

    return build


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory, ci_docs_build) -> Path:
    """The folder of the built site (strict: a warning, or a formula that cannot be rendered, fails)."""
    site = tmp_path_factory.mktemp("site")
    result = ci_docs_build(ROOT, site)
    assert result.returncode == 0, f"mkdocs build failed:\n{result.stdout}\n{result.stderr}"
    return site
