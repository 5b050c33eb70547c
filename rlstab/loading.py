"""``rlstab.load``: presets, YAML files, YAML text and dicts into an [`Objective`][rlstab.Objective].

YAML is read with a safe loader (no tags, so ``!!python/object`` is refused) that also refuses
duplicate keys. ``extends: <preset or file>`` starts from another objective and deep-merges the
rest over it: mappings merge key by key, lists and scalars replace, and a component whose
``kind`` changes is replaced whole (its old fields belong to another kind). ``name`` and
``description`` are not inherited: a derived objective is not its parent.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlstab.errors import ConfigError, describe_validation_error
from rlstab.objective import Objective
from rlstab.presets import closest_presets, preset_names, preset_path


class _StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads ``1e-6`` as a float (YAML 1.2), not a string."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_StrictSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "python/" in str(err) or "could not determine a constructor" in str(err):
            problem = f"{problem} (YAML tags are not allowed: objectives are plain data)"
        raise ConfigError(source, [f"malformed YAML: {where}{problem}"]) from None


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        if "kind" in override and override.get("kind") != base.get("kind"):
            return copy.deepcopy(override)
        merged = copy.deepcopy(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def _resolve(data: Any, source: str, directory: Path | None, chain: tuple[tuple[str, str], ...]) -> dict:
    """``chain``: ``(identity, label)`` of each objective being resolved; identities are resolved
    paths, so a cycle is caught however its file names are spelt (``../dir/a.yaml``, absolute)."""
    if not isinstance(data, dict):
        raise ConfigError(source, [f"<top level>: expected a mapping of objective fields, got {type(data).__name__}"])
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(source, [f"extends = {parent!r}: must be a preset name or a YAML file path"])
    base_source, base_text, base_dir = _locate(parent, directory, source)
    base_id = _identity(base_source, base_dir)
    if base_id in (identity for identity, _ in chain):
        labels = [label for _, label in chain] + [base_source]
        raise ConfigError(source, [f"extends = {parent!r}: circular ({' -> '.join(labels)})"])
    base = _resolve(
        parse_yaml(base_text, base_source), base_source, base_dir, chain + ((base_id, base_source),)
    )
    rest = {k: v for k, v in data.items() if k != "extends"}
    merged = _merge(base, rest)
    for key in ("name", "description"):  # a derived objective is not its parent
        if key not in rest:
            merged.pop(key, None)
    return merged


def _identity(label: str, directory: Path | None) -> str:
    """What makes two objectives in an ``extends`` chain the same: the resolved file, or the preset."""
    return label if directory is None else str(Path(label).resolve())


def _locate(name: str, directory: Path | None, referrer: str) -> tuple[str, str, Path | None]:
    if name in preset_names():
        path = preset_path(name)
        return f"preset {name}", path.read_text(), None
    path = Path(name)
    if not path.is_absolute() and directory is not None:
        path = directory / path
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return str(path), path.read_text(), path.parent
    raise ConfigError(
        referrer,
        [f"extends = {name!r}: neither a preset ({closest_presets(name)}) nor an existing .yaml file"],
    )


def load_data(source: Any) -> tuple[dict, str]:
    """The resolved mapping of an objective (``extends`` applied) and a label for error messages."""
    if isinstance(source, dict):
        return _resolve(copy.deepcopy(source), "<dict>", Path.cwd(), ()), "<dict>"
    if isinstance(source, Path) or (isinstance(source, str) and _looks_like_path(source)):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(str(path), ["no such file"])
        label = str(path)
        chain = ((_identity(label, path.parent), label),)
        return _resolve(parse_yaml(path.read_text(), label), label, path.parent, chain), label
    if isinstance(source, str):
        if source in preset_names():
            label = f"preset {source}"
            return _resolve(parse_yaml(preset_path(source).read_text(), label), label, None, ((label, label),)), label
        if "\n" not in source and ":" not in source:
            raise ConfigError(
                source, [f"not a preset ({closest_presets(source)}), a .yaml file, or YAML text"]
            )
        return _resolve(parse_yaml(source, "<yaml text>"), "<yaml text>", Path.cwd(), ()), "<yaml text>"
    raise TypeError(f"rlstab.load takes a preset name, a YAML path or text, a dict or an Objective, not {type(source).__name__}")


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and text.endswith((".yaml", ".yml"))


def load(source: Any) -> Objective:
    """An [`Objective`][rlstab.Objective] from a preset name, a YAML path, YAML text, a dict, or an Objective.

    Raises [`ConfigError`][rlstab.ConfigError] with one line per problem, each naming the source, the
    YAML path (``masks[0].tau_p``), the offending value and what is allowed.
    """
    if isinstance(source, Objective):
        return source
    data, label = load_data(source)
    try:
        return Objective.model_validate(data)
    except ValidationError as err:
        raise ConfigError(label, describe_validation_error(err, data)) from None
