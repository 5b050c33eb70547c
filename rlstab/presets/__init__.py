"""Presets: YAML objectives shipped in this folder, one per published method."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).parent


@cache
def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets (the YAML files' stems), sorted."""
    return tuple(sorted(p.stem for p in _HERE.glob("*.yaml")))


def preset_path(name: str) -> Path:
    return _HERE / f"{name}.yaml"
