"""How large an objective may be: limits far above any real objective, checked before the expensive work.

The largest preset is a few dozen lines and a few hundred bytes; a hand-written objective with a
long description is a few KB. These limits are a hundred times that and more, so no real file
meets them, while a hostile or broken one (a 50 MB file, an alias bomb, ten thousand levels of
nesting, a cyclic ``extends:`` chain of a thousand files) is refused in well under a second with
one line that names the limit, instead of a traceback, a hang or gigabytes of memory.

The YAML reader (`parse_yaml`) checks them while it reads, so it
stops at the first value past a limit; `check_data` checks
a Python mapping handed to [`rlstab.load`][rlstab.load] the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlstab.errors import ConfigError, short


@dataclass(frozen=True)
class Limits:
    """The limits on one objective (docs/yaml.md, "Limits")."""

    bytes: int = 256 * 1024
    """Size of an objective with every file its ``extends:`` chain reads (YAML text: characters)."""
    extends: int = 32
    """Objectives in one ``extends:`` chain, the first file included."""
    depth: int = 32
    """Nesting of mappings and lists (an objective needs 3: ``masks: [{kind: ...}]``)."""
    keys: int = 256
    """Keys of one mapping."""
    items: int = 256
    """Items of one list."""
    values: int = 10_000
    """Values (scalars, mappings, lists) in one file, counting each use of an alias in full."""


LIMITS = Limits()


def check_data(data: Any, source: str, limits: Limits = LIMITS) -> None:
    """Refuse a Python mapping past the limits (or with keys that are not text), without recursion.

    A structure that contains itself is refused as nesting past ``limits.depth``.
    """
    stack = [(data, "", 1)]
    values = 0
    while stack:
        node, path, depth = stack.pop()
        values += 1
        if values > limits.values:
            raise ConfigError(source, [f"more than {limits.values:,} values (the limit on values)"])
        if not isinstance(node, dict | list):
            continue
        where = path or "<top level>"
        if depth > limits.depth:
            raise ConfigError(
                source, [f"{where}: nested deeper than {limits.depth} levels (the limit on nesting; or a structure that contains itself)"]
            )
        if isinstance(node, list):
            if len(node) > limits.items:
                raise ConfigError(source, [f"{where}: a list of {len(node):,} items; at most {limits.items} are allowed (the limit on list items)"])
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node))
            continue
        if len(node) > limits.keys:
            raise ConfigError(source, [f"{where}: a mapping of {len(node):,} keys; at most {limits.keys} are allowed (the limit on keys)"])
        for key, value in node.items():
            if not isinstance(key, str):
                raise ConfigError(source, [f"{where}: key {short(key)} is not text; keys are field names"])
            stack.append((value, f"{path}.{key}" if path else key, depth + 1))

