"""The documentation names every preset, objective field and component kind, so none ships undocumented."""

import re
from pathlib import Path

import pytest

import rlstab
from rlstab.objective import Objective
from rlstab.registry import FAMILIES, registrations

DOCS = Path(__file__).parents[1] / "docs"


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_preset_is_in_the_paper_index_and_the_presets_page(name):
    assert f"`{name}`" in (DOCS / "papers.md").read_text(), name
    assert f"`{name}`" in (DOCS / "presets.md").read_text(), name


def _built_in_kinds(field: str) -> set[str]:
    """The kinds rlstab itself registers for an objective field (none for plain fields)."""
    if field not in FAMILIES:
        return set()
    return {r.kind for r in registrations(field) if r.distribution == "rlstab"}


@pytest.mark.parametrize("field", sorted(Objective.model_fields))
def test_every_objective_field_and_kind_is_in_the_objective_file_table(field):
    table = (DOCS / "yaml.md").read_text().split("## Fields")[1].split("\n\n")[1]
    row = next((line for line in table.splitlines() if f"`{field}`" in line.split("|")[1]), None)
    assert row is not None, f"{field} missing from the Fields table of yaml.md"
    if field in FAMILIES:  # the row's kind list is the registry's, exactly (a link's text is the list)
        listed = re.search(r"\[(`[^]]*`)\]", row.split("|")[3]).group(1)
        assert set(re.findall(r"`([^`]+)`", listed)) == _built_in_kinds(field), field
