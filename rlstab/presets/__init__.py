"""Presets: YAML objectives shipped in this folder, one per published method."""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path

_HERE = Path(__file__).parent


@cache
def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets (the YAML files' stems), sorted."""
    return tuple(sorted(p.stem for p in _HERE.glob("*.yaml")))


def preset_path(name: str) -> Path:
    return _HERE / f"{name}.yaml"


def closest_presets(name: str) -> str:
    """A hint for an unknown preset name: the closest names, or where the list is."""
    close = difflib.get_close_matches(name, preset_names(), n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "`rlstab presets` lists them"
