"""The documentation names every preset, so a new preset cannot be shipped undocumented."""

from pathlib import Path

import pytest

import rlstab

DOCS = Path(__file__).parents[1] / "docs"


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_preset_is_in_the_paper_index_and_the_presets_page(name):
    assert f"`{name}`" in (DOCS / "papers.md").read_text(), name
    assert f"`{name}`" in (DOCS / "presets.md").read_text(), name
