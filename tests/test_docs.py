"""The documentation names every preset, objective field and component kind, so none ships undocumented."""

import typing
from pathlib import Path

import pytest

import rlstab
from rlstab.objective import Objective

DOCS = Path(__file__).parents[1] / "docs"


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_preset_is_in_the_paper_index_and_the_presets_page(name):
    assert f"`{name}`" in (DOCS / "papers.md").read_text(), name
    assert f"`{name}`" in (DOCS / "presets.md").read_text(), name


def _kinds(annotation) -> set[str]:
    """The ``kind`` names a field's annotation accepts (through lists, unions, Optional and Annotated)."""
    found = set()
    if isinstance(annotation, type) and hasattr(annotation, "model_fields") and "kind" in annotation.model_fields:
        found.add(annotation.model_fields["kind"].default)
    for arg in typing.get_args(annotation):
        found |= _kinds(arg)
    return found


@pytest.mark.parametrize("field", sorted(Objective.model_fields))
def test_every_objective_field_and_kind_is_in_the_objective_file_table(field):
    table = (DOCS / "yaml.md").read_text().split("## Fields")[1].split("\n\n")[1]
    row = next((line for line in table.splitlines() if f"`{field}`" in line.split("|")[1]), None)
    assert row is not None, f"{field} missing from the Fields table of yaml.md"
    for kind in _kinds(Objective.model_fields[field].annotation):
        assert f"`{kind}`" in row, f"{field}: kind {kind} missing"
