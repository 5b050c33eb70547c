"""``rlstab.load``: presets, YAML files, YAML text and dicts into an [`Objective`][rlstab.Objective].

Whatever the source, the same checks run before anything expensive: the size and encoding of the
text, the YAML (plain YAML 1.2 data, no tags, no duplicate keys, see
`parse_yaml`), the limits (`Limits`), the
``extends:`` chain; then the objective's fields. Every problem is a
[`ConfigError`][rlstab.ConfigError], whatever the input.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlstab.errors import ConfigError
from rlstab.loading.extends import Layer, Merged, file_layer, preset_layer, resolve
from rlstab.loading.limits import LIMITS, check_data
from rlstab.loading.lists import file_paths
from rlstab.loading.wording import describe_validation_error
from rlstab.loading.yaml12 import parse_yaml
from rlstab.objective import Objective
from rlstab.presets import closest_presets, preset_names


def load_data(source: Any) -> tuple[dict, str]:
    """The resolved mapping of an objective (``extends`` applied) and a label for error messages."""
    merged, label = _merged(source)
    return merged.data, label


def _merged(source: Any) -> tuple[Merged, str]:
    if isinstance(source, dict):
        check_data(source, "<dict>")
        first = Layer(copy.deepcopy(source), "<dict>", Path.cwd(), "<dict>")
        return resolve(first, 0), "<dict>"
    if isinstance(source, Path) or (isinstance(source, str) and _looks_like_path(source)):
        label = str(source)
        first, used = file_layer(Path(source), label)
        return resolve(first, used), label
    if isinstance(source, str):
        if source in preset_names():
            first, used = preset_layer(source)
            return resolve(first, used), first.source
        if len(source) > LIMITS.bytes:
            raise ConfigError(
                "<yaml text>", [f"{len(source):,} characters; an objective may have at most {LIMITS.bytes:,} (the limit on objective size)"]
            )
        if "\n" not in source and ":" not in source:
            raise ConfigError(source, [f"not a preset ({closest_presets(source)}), a .yaml file, or YAML text"])
        first = Layer(parse_yaml(source, "<yaml text>"), "<yaml text>", Path.cwd(), "<yaml text>")
        return resolve(first, len(source)), "<yaml text>"
    raise TypeError(f"rlstab.load takes a preset name, a YAML path or text, a dict or an Objective, not {type(source).__name__}")


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and text.endswith((".yaml", ".yml"))


def load(source: Any) -> Objective:
    """An [`Objective`][rlstab.Objective] from a preset name, a YAML path, YAML text, a dict, or an Objective.

    Raises [`ConfigError`][rlstab.ConfigError] with one line per problem, each naming the source, the
    YAML path (``masks[0].tau_p``), the offending value and what is allowed; an unreadable file is a
    ``ConfigError`` too. ``Objective.dropped`` lists the components that a list of the ``extends:``
    chain replaced without keeping (see [`Dropped`][rlstab.loading.lists.Dropped]).
    """
    if isinstance(source, Objective):
        return source
    merged, label = _merged(source)
    try:
        objective = Objective.model_validate(merged.data)
    except ValidationError as err:
        raise ConfigError(label, file_paths(describe_validation_error(err, merged.data, Objective), merged.starts)) from None
    if merged.dropped:  # not a field: equality, the fingerprint and to_yaml leave it out
        object.__setattr__(objective, "dropped", merged.dropped)
    return objective
