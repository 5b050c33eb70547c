"""docs/plugins.md is checked block by block: the example plugin's files shown verbatim, the listing
as ``rlstab components`` prints it, the families table as the registry holds it, the kit's example run."""

from __future__ import annotations

import importlib
import re
from importlib.metadata import requires
from pathlib import Path
from typing import ClassVar, Literal

import pytest
import torch

import rlstab
from rlstab.cli import main
from rlstab.masks import Mask
from rlstab.registry import FAMILIES, isolated
from rlstab.testing import check_component

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "docs" / "plugins.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S)


def test_the_example_files_are_shown_verbatim():
    shown = [(text.split("\n", 1)) for _, text in BLOCKS if text.startswith("# examples/")]
    assert len(shown) == 2
    for first, rest in shown:
        path = ROOT / first.removeprefix("# ")
        assert rest == path.read_text(), path


def test_the_entry_point_block_is_the_plugins_declaration():
    (toml,) = [text for language, text in BLOCKS if language == "toml"]
    assert toml in (ROOT / "examples" / "rlstab-wreinforce" / "pyproject.toml").read_text()


def test_the_listing_is_what_rlstab_components_prints(capsys):
    (console,) = [text for language, text in BLOCKS if language == "console"]
    command, *lines = console.splitlines()
    assert main(command.removeprefix("$ rlstab ").split()) == 0
    assert capsys.readouterr().out.splitlines() == lines


def test_the_families_table_is_the_registry():
    """Each row names its field's base class, linked to its entry in the API reference."""
    table = PAGE.split("## Families")[1].split("\n\n")[1].splitlines()[2:]
    rows = [[cell.strip().strip("`") for cell in line.split("|")[1:-1]] for line in table]
    assert [row[0] for row in rows] == list(FAMILIES)
    for field, link, _, runs in rows:
        shown, base = re.fullmatch(r"\[`([\w.]+)`\]\[([\w.]+)\]", link).groups()
        assert shown == base, field
        module, name = base.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is FAMILIES[field].base, field
        assert runs == FAMILIES[field].scope, field


def test_the_kit_example_runs():
    (code,) = [text for language, text in BLOCKS if language == "python" and "check_component" in text]
    namespace: dict = {}
    exec(compile(code, "plugins.md", "exec"), namespace)
    namespace["test_w_reinforce_passes_the_kit"]()


def test_the_kit_says_it_needs_the_test_extra(monkeypatch):
    """The page says how to install what the kit needs (jsonschema); the kit says the same when it is
    missing, the extra holds it, and the example plugin's own test extra installs it."""
    text = " ".join(PAGE.split("## Test it")[1].split("## Package it")[0].split())
    assert "needs `jsonschema`" in text and "`pip install 'rlstab[test]'`" in text
    assert any(r.startswith("jsonschema") and 'extra == "test"' in r for r in requires("rlstab"))
    assert 'test = ["rlstab[test]"]' in (ROOT / "examples" / "rlstab-wreinforce" / "pyproject.toml").read_text()
    from rlstab_wreinforce import WReinforce

    monkeypatch.setitem(__import__("sys").modules, "jsonschema", None)  # import jsonschema -> ImportError
    with pytest.raises(AssertionError, match=re.escape("needs the jsonschema package (pip install 'rlstab[test]')")):
        check_component(WReinforce())


class RecordingQuantile(Mask):
    """Asks for the median of the step's log-probabilities; keeps every token and records its threshold."""

    kind: Literal["recording_quantile"] = "recording_quantile"
    seen: ClassVar[list] = []

    def quantile_request(self, t):
        return t.logprobs, t.valid_bool, 0.5

    def keep(self, t, threshold):
        RecordingQuantile.seen.append(threshold)
        return torch.ones_like(t.logprobs)

    def describe(self):
        return "recording_quantile: keeps every token"


def test_keep_gets_threshold_none_on_a_step_without_valid_tokens():
    """What the page says a mask's ``keep`` receives, from the compiled objective itself."""
    text = " ".join(PAGE.split("## Scopes")[1].split("## State")[0].split())
    assert "`keep` receives `threshold=None`" in text
    RecordingQuantile.seen.clear()
    with isolated():
        rlstab.register(RecordingQuantile)
        loss_fn = rlstab.load("extends: grpo\nmasks: [{kind: recording_quantile}]\n").compile()
        for response_mask in ([[False, False]], [[True, True]]):
            loss_fn(rlstab.TokenBatch(
                logprobs=torch.log(torch.tensor([[0.8, 0.5]])), old_logprobs=torch.log(torch.tensor([[0.8, 0.5]])),
                advantages=torch.tensor([1.0]), response_mask=torch.tensor(response_mask),
            ))
    empty, full = RecordingQuantile.seen
    assert empty is None  # no valid token: no quantile
    # median of log 0.8 = -0.22314 and log 0.5 = -0.69315: (-0.22314 - 0.69315) / 2 = -0.45815
    assert full.item() == pytest.approx(-0.45815, abs=1e-5)
