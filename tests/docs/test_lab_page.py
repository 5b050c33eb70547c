"""docs/lab.md (and the README's lab lines) checked block by block: the regime YAML is the shipped
files', every ``rlstab compare`` command parses and passes the lab's input checks, the Python example
runs, the error lines are what the lab prints, and the published tables are the stored results'."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

import rlstab.lab
from rlstab.cli import build_parser
from rlstab.errors import ConfigError
from rlstab.lab import load_regime, plan
from rlstab.lab.regimes import regime_names
from rlstab.lab.spec import RunSpec, mismatch, write_spec
from rlstab.loading import load

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "docs" / "lab.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S)


def test_the_regime_blocks_are_the_shipped_files_in_order():
    section = PAGE.split("## Regimes")[1].split("\n## ")[0]
    blocks = re.findall(r"`([\w-]+)`: [^\n]*\n\n```yaml\n(.*?)```", section, flags=re.S)
    assert [name for name, _ in blocks] == sorted(regime_names(), key=["default", "entropy-collapse", "policy-lag", "sparse"].index)
    for name, text in blocks:
        assert text == (ROOT / "rlstab" / "lab" / "regimes" / f"{name}.yaml").read_text(), name
        assert load_regime(name).name == name


def test_the_regime_field_list_names_every_field():
    fields = set(rlstab.lab.Regime.model_fields) - {"name", "description"}
    listed = set(re.findall(r"`(\w+)`", PAGE.split("The fields are")[1].split(".")[0]))
    assert listed == fields


def _commands(text: str) -> list[list[str]]:
    commands = []
    for kind, block in re.findall(r"```(\w+)\n(.*?)```", text, flags=re.S):
        if kind != "bash":
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("rlstab compare"):
                commands.append(shlex.split(line)[1:])
    return commands


COMMANDS = _commands(PAGE) + _commands((ROOT / "README.md").read_text())


def test_there_are_commands_to_check():
    assert len(COMMANDS) >= 5


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c[:6]) for c in COMMANDS])
def test_every_compare_command_parses_and_passes_the_input_checks(argv, tmp_path, monkeypatch):
    args = build_parser().parse_args(argv)
    monkeypatch.chdir(ROOT)  # objective files are relative to the repository
    p = plan(args.objective, out=tmp_path / "out", baseline=args.baseline, seeds=args.seeds, steps=args.steps,
             regimes=args.regime or ["default"], task=args.task, model=args.model)
    assert len(p.jobs) == len(args.objective) * args.seeds * len(args.regime or ["default"])


def test_the_python_example_runs(tmp_path, monkeypatch):
    (code,) = [block for kind, block in BLOCKS if kind == "python"]
    real = rlstab.lab.compare

    def small(objectives, **kwargs):  # the example's call, shortened to one step of one seed
        kwargs["out"] = tmp_path / kwargs["out"]
        return real(objectives, **{**kwargs, "seeds": 1, "steps": 1, "cache_dir": tmp_path / "cache", "progress": False})

    monkeypatch.setattr(rlstab.lab, "compare", small)
    printed = []
    exec(compile(code, "docs/lab.md", "exec"), {"print": printed.append})
    assert set(printed[0]) == {"mean", "low", "high", "n", "wins", "ties", "losses", "distinguishable"}


def test_the_error_lines_are_what_the_lab_prints(tmp_path, monkeypatch):
    lines = PAGE.split("the exit status is 2:\n\n")[1].split("\n\n")[0].splitlines()
    assert lines[0].strip() == str(pytest.raises(ConfigError, load_regime, "policy_lag").value)
    monkeypatch.chdir(tmp_path)
    o = load("grpo")
    spec = RunSpec("grpo", o.to_yaml(), o.fingerprint(), load_regime("default"), "add2", "tiny", 0, 100)
    folder = spec.folder(Path("runs/lab"))
    write_spec(spec, folder)
    longer = RunSpec(**{**spec.__dict__, "steps": 200})
    assert lines[1].strip() == f"rlstab compare: {mismatch(longer, folder)}"


PUBLISHED = sorted((ROOT / "docs" / "lab").glob("*.json"))


def test_there_are_published_results():
    assert [p.stem for p in PUBLISHED] == ["token"]  # the policy-lag and sparse grids are still running


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_the_published_tables_are_the_stored_results_report(path):
    from rlstab.lab.report import markdown

    data = json.loads(path.read_text())
    text = markdown(data)
    sections = text[text.index("## Regime"):text.index("## Definitions")].rstrip()
    assert sections.replace("\n## ", "\n#### ").replace("## Regime", "#### Regime", 1) in PAGE
    assert f"(images/lab_{path.stem}.png)" in PAGE
    assert (ROOT / "docs" / "images" / f"lab_{path.stem}.png").stat().st_size > 10_000
    assert "--out runs/lab/" in data["command"]  # the page's commands, no machine's path
    assert len(data["settings"]["seeds"]) >= 5
