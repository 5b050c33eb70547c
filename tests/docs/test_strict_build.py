"""CI's docs check can fail: scripts/test.sh's own ``mkdocs build`` line stops on a warning.

``--strict`` turns warnings into a failure only when they are logged: ``--quiet`` raises the log
level above WARNING, and the build then passed with 11 warnings. Here the same command runs on a
copy of the project with a broken page link and a broken API reference planted in one page, and
must fail naming both; the unplanted tree is ``built_site`` (conftest.py), built by the same
command, which must pass. Two builds: one here (13 s on two shared cores), one shared with the
other docs tests (17 s).
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).parents[2]
PLANTED = "\nSee [a page that is not there](nowhere.md) and [an object that is not there][rlstab.nowhere].\n"


def _copy_of_the_project(to: Path) -> Path:
    """What ``mkdocs build`` reads: mkdocs.yml, docs/, docs_build/ (hook, templates) and rlstab/ (docstrings)."""
    to.mkdir()
    shutil.copy2(ROOT / "mkdocs.yml", to / "mkdocs.yml")
    for folder in ("docs", "docs_build", "rlstab"):
        shutil.copytree(ROOT / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def test_the_ci_command_is_strict_and_logs_its_warnings(ci_docs_command):
    _, argv = ci_docs_command
    assert "--strict" in argv
    assert not {"-q", "--quiet"} & set(argv), "scripts/test.sh: --quiet hides every warning from --strict"


def test_a_broken_link_fails_the_ci_command(tmp_path, ci_docs_build, built_site):
    assert (built_site / "index.html").is_file()  # the unplanted tree passes the same command
    project = _copy_of_the_project(tmp_path / "project")
    page = project / "docs" / "concepts.md"
    page.write_text(page.read_text() + PLANTED)
    result = ci_docs_build(project, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Doc file 'concepts.md' contains a link 'nowhere.md', but the target is not found" in output, output
    assert "Could not find cross-reference target 'rlstab.nowhere'" in output, output
    assert "Aborted with 2 warnings in strict mode!" in output, output


def test_the_home_page_builds_the_docs_as_ci_does(ci_docs_command):
    """docs/index.md tells a user to build with ``mkdocs build --strict``: CI's command, without its site folder."""
    _, argv = ci_docs_command
    ci = " ".join(word for word in argv[3:] if word not in ("-d", "$site"))
    assert f"mkdocs {ci}" == "mkdocs build --strict"
    assert '$ pip install -e ".[docs]"    # plus what builds these pages: mkdocs build --strict' in (
        ROOT / "docs" / "index.md"
    ).read_text()
