"""The command-line refusals the pages quote are what the commands print (issue 38: paths, repeats, Ray, OpenRLHF)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import rlstab.lab.backends as backends
import rlstab.trainer.models as models
from rlstab.cli import main

ROOT = Path(__file__).parents[2]
compare_command = importlib.import_module("rlstab.lab.compare_command")

# page: [(argv, Ray installed?, the line the page shows)]
QUOTED = {
    "docs/demo.md": [
        (["demo", "--out", "notes.txt/run"], None,
         "rlstab demo: --out notes.txt/run: notes.txt is a file, so no folder can be made under it"),
        (["demo", "--model", "gpt5"], None, "rlstab demo: unknown model 'gpt5'; choose one of tiny, smollm2"),
        (["demo", "--model", "smollm2", "--task", "add1", "--warmup-steps", "5"], None,
         "rlstab demo: --warmup-steps applies to --model tiny only (SmolLM2 is pretrained, without a warm start); "
         "leave it out"),
    ],
    "docs/audit.md": [(["audit", "--out", "notes.txt"], None, "rlstab audit: --out notes.txt: is a file, not a folder")],
    "docs/lab.md": [
        (["compare", "--objective", "grpo", "--ray-address", "auto", "--out", "o"], False,
         "rlstab compare: --ray-address needs Ray, which is not installed: pip install 'rlstab[ray]'"),
        (["compare", "--objective", "grpo", "--ray-address", "auto", "--workers", "4", "--out", "o"], True,
         "rlstab compare: --workers 4 and --ray-address auto: with Ray each run is a task asking for one CPU and the "
         "cluster sets how many run at once; give one of the two"),
    ],
    "docs/yaml.md": [
        (["demo", "--steps"], None, "rlstab demo: argument --steps: expected one argument (see rlstab demo --help for usage)"),
        (["validate", "--trainer", "verl", "--trainer", "trl", "grpo"], None,
         "rlstab validate: argument --trainer: given twice (verl, then trl): give it once "
         "(see rlstab validate --help for usage)"),
        (["compare", "--objective", "grpo", "--baseline", "", "--out", "o"], None,
         "rlstab compare: argument --baseline: empty; give a value or leave the flag out "
         "(see rlstab compare --help for usage)"),
    ],
}
CASES = [(page, *case) for page, cases in QUOTED.items() for case in cases]


def said(page: str) -> str:
    """The page's text with its line breaks and indents as single spaces (a quoted line may be wrapped)."""
    return " ".join((ROOT / page).read_text().split())


@pytest.mark.parametrize(("page", "argv", "ray", "line"), CASES, ids=[f"{c[0]}: {' '.join(c[1])}" for c in CASES])
def test_the_page_quotes_what_the_command_prints(page, argv, ray, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file\n")
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("loaded a model"))
    monkeypatch.setattr(backends, "backend", lambda *a, **k: pytest.fail("started the runs"))
    if ray is not None:
        monkeypatch.setattr(compare_command, "installed", lambda module: ray)
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    assert (status, capsys.readouterr().err) == (2, line + "\n")
    assert " ".join(line.split()) in said(page)


def test_the_openrlhf_page_quotes_the_launchers_line(monkeypatch, capsys):
    from rlstab.adapters.openrlhf.launcher import main as launch

    monkeypatch.setitem(sys.modules, "openrlhf", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit):
        launch(["--objective", "stapo"])
    line = capsys.readouterr().err.rstrip("\n")
    assert line in said("docs/adapters/openrlhf.md")
