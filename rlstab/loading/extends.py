"""``extends:``: an objective that starts from another one.

``extends: <preset or file>`` starts from another objective and deep-merges the rest over it:
mappings merge key by key, lists and scalars replace, and a component whose ``kind`` changes is
replaced whole (its old fields belong to another kind). A list of components replaces too, and the
components it drops are recorded; ``{append: [...]}`` adds to the parent's list instead (see
[`rlstab.loading.lists`][rlstab.loading.lists]). ``name`` and ``description`` are not inherited: a
derived objective is not its parent.

The chain is followed in a loop, not by recursion, and is bounded twice: at most
``Limits.extends`` objectives, and at most ``Limits.bytes`` of text in all of them together.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstab.errors import ConfigError, short
from rlstab.loading.limits import LIMITS, Limits
from rlstab.loading.lists import Dropped, resolve_lists
from rlstab.loading.text import read_text
from rlstab.loading.yaml12 import parse_yaml
from rlstab.presets import closest_presets, preset_names, preset_path


@dataclass(frozen=True)
class Layer:
    """One objective of a chain: its data, its label in messages, and where its relative ``extends`` points."""

    data: Any
    source: str
    directory: Path | None  # None for a preset, which can extend only presets
    identity: str  # what makes two objectives of a chain the same (a resolved path, or the preset)


def preset_layer(name: str, limits: Limits = LIMITS, budget: int | None = None) -> tuple[Layer, int]:
    """A shipped preset and the bytes it used."""
    source = f"preset {name}"
    text, size = read_text(preset_path(name), source, limits.bytes if budget is None else budget, limits.bytes)
    return Layer(parse_yaml(text, source, limits), source, None, source), size


def file_layer(path: Path, source: str, limits: Limits = LIMITS, budget: int | None = None) -> tuple[Layer, int]:
    """An objective file and the bytes it used."""
    text, size = read_text(path, source, limits.bytes if budget is None else budget, limits.bytes)
    return Layer(parse_yaml(text, source, limits), source, path.parent, _resolved(path)), size


@dataclass(frozen=True)
class Merged:
    """An objective's chain merged: its data, the components its files' lists dropped, and where the first
    file's own list items start (``Lists.starts``)."""

    data: dict
    dropped: tuple[Dropped, ...]
    starts: dict[str, tuple[str, int]]


def resolve(first: Layer, used: int, limits: Limits = LIMITS) -> Merged:
    """``first`` with its ``extends`` chain merged under it; ``used``: bytes its own text took."""
    chain = [first]
    while True:
        layer = chain[-1]
        if layer.data is None:
            raise ConfigError(layer.source, ["the objective is empty: expected a mapping of objective fields"])
        if not isinstance(layer.data, dict):
            raise ConfigError(
                layer.source, [f"<top level>: expected a mapping of objective fields, got {type(layer.data).__name__}"]
            )
        parent = layer.data.get("extends")
        if parent is None:
            break
        if not isinstance(parent, str):
            raise ConfigError(layer.source, [f"extends = {short(parent)}: must be a preset name or a YAML file path"])
        if len(chain) >= limits.extends:
            raise ConfigError(
                first.source,
                [f"extends: a chain of more than {limits.extends} objectives (the limit on extends), at {short(parent)}"],
            )
        base, size = _locate(parent, layer, limits, limits.bytes - used)
        used += size
        if base.identity in (c.identity for c in chain):
            labels = " -> ".join([c.source for c in chain] + [base.source])
            raise ConfigError(layer.source, [f"extends = {short(parent)}: circular ({labels})"])
        chain.append(base)
    merged: dict = {}
    dropped: list[Dropped] = []
    below: Layer | None = None  # the parent of the layer being merged
    for layer in reversed(chain):
        rest = {k: v for k, v in layer.data.items() if k != "extends" or below is None}
        lists, problems = resolve_lists(merged, rest, layer.source, below and below.source, limits)
        if problems:
            raise ConfigError(layer.source, problems)
        rest.update(lists.values)
        dropped += lists.dropped
        merged = _merge(merged, rest) if below is not None else rest
        for key in ("name", "description"):  # a derived objective is not its parent
            if below is not None and key not in rest:
                merged.pop(key, None)
        below = layer
    return Merged(merged, tuple(dropped), lists.starts)


def _locate(name: str, referrer: Layer, limits: Limits, budget: int) -> tuple[Layer, int]:
    if name in preset_names():
        return preset_layer(name, limits, budget)
    path = Path(name)
    if not path.is_absolute() and referrer.directory is not None:
        path = referrer.directory / path
    if path.suffix in (".yaml", ".yml") and _is_file(path):
        return file_layer(path, str(path), limits, budget)
    raise ConfigError(
        referrer.source,
        [f"extends = {short(name)}: neither a preset ({closest_presets(name)}) nor an existing .yaml file"],
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the system, or with a NUL byte
        return False


def _resolved(path: Path) -> str:
    """The identity of a file in a chain: its resolved path, so ``../dir/a.yaml`` and ``a.yaml`` are one file."""
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # a symlink loop: the file cannot be read either
        return str(path.absolute())


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        if "kind" in override and override.get("kind") != base.get("kind"):
            return copy.deepcopy(override)
        merged = copy.deepcopy(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)
