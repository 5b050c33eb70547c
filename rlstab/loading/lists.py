"""Lists of components under ``extends:``: a list replaces the parent's and says what it drops; ``{append: [...]}`` adds.

An objective's lists of components (``masks``, ``shadow_masks``, ``reweighters``, ``regularisers``,
``reward_shaping``: every list field of [`Objective`][rlstab.Objective]) take one of three forms in
a file, each applied to the list the file's parent ends with (the field's default, empty, in a file
that extends nothing):

- ``masks: [...]``: the list replaces the parent's. Each component of the parent's list whose kind
  the new list does not have is dropped, and said so: a [`Dropped`][rlstab.loading.lists.Dropped]
  record in ``Objective.dropped``, a note from ``rlstab validate`` and ``rlstab explain``;
- ``masks: {append: [...]}``: the parent's list, then these components;
- ``masks: {replace: [...]}``: the list replaces the parent's on purpose, with no note.

Every file of a chain follows the same rule against the list below it. Lists inside a component
(a field whose value is a list) are values, not components: they replace, without a note.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any, get_origin

from rlstab.errors import short
from rlstab.loading.limits import Limits
from rlstab.objective import Objective

FORMS = ("append", "replace")
"""The keys of a list field's mapping form: add to the parent's list, or replace it without a note."""


@cache
def component_lists() -> tuple[str, ...]:
    """The objective's list fields (``masks``, ...), in the model's order."""
    return tuple(name for name, field in Objective.model_fields.items() if get_origin(field.annotation) is list)


@dataclass(frozen=True)
class Dropped:
    """Components of a parent's list that a file's list replaced without keeping (``extends:`` lists replace).

    ``str()`` is the note ``rlstab validate`` and ``rlstab explain`` print, which says how to keep them.

    Attributes:
        field: the list's field, its YAML path (``masks``).
        kinds: the dropped components' kinds, in the parent's order (``("s2t",)``).
        indices: their places in the parent's list (``masks[0]`` there).
        parent: the objective the file extends (``preset stapo``, a file).
        source: the file whose list replaced the parent's.
    """

    field: str
    kinds: tuple[str, ...]
    indices: tuple[int, ...]
    parent: str
    source: str

    def __str__(self) -> str:
        f = self.field
        parts = ", ".join(f"{kind} ({f}[{i}])" for kind, i in zip(self.kinds, self.indices))
        it = "it" if len(self.kinds) == 1 else "them"
        return (
            f"{self.source}: note: {f} replaces the {f} of {self.parent}, dropping {parts}; to keep {it}, write "
            f"{f}: {{append: [...]}} with only the added ones; {f}: {{replace: [...]}} replaces without this note"
        )


@dataclass(frozen=True)
class Lists:
    """A file's list fields as plain lists, what its replacing lists dropped, and where its own items start.

    ``starts``: for each list field the file gave in a mapping form, the form and the index of its first item in
    the merged list (``("append", 2)`` after a parent's two), so an error names the file's path (``masks.append[0]``)."""

    values: dict[str, list]
    dropped: tuple[Dropped, ...]
    starts: dict[str, tuple[str, int]]


def resolve_lists(parent: dict, data: dict, source: str, parent_source: str | None, limits: Limits) -> tuple[Lists, list[str]]:
    """``data``'s list fields resolved against ``parent``'s (merged) lists; and the problems of their forms."""
    values: dict[str, list] = {}
    dropped: list[Dropped] = []
    starts: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    for field in component_lists():
        if field not in data:
            continue
        value, before = data[field], parent.get(field, [])
        if not isinstance(value, dict):  # a list replaces (anything else is the model's error to report)
            gone = _dropped(before, value) if parent_source is not None else []
            if gone:
                kinds, indices = zip(*gone)
                dropped.append(Dropped(field, kinds, indices, parent_source, source))
            continue
        form, items, problem = _form(field, value)
        if problem:
            problems.append(problem)
        elif form == "replace":
            values[field], starts[field] = items, (form, 0)
        elif not isinstance(before, list):
            problems.append(f"{field}.append: the {field} it adds to is {short(before)}, not a list (in {parent_source})")
        elif len(before) + len(items) > limits.items:
            problems.append(
                f"{field}.append: {len(before)} items and {len(items)} more; at most {limits.items} are allowed "
                "(the limit on list items)"
            )
        else:
            values[field], starts[field] = [*before, *items], (form, len(before))
    return Lists(values, tuple(dropped), starts), problems


def _form(field: str, value: dict) -> tuple[str, list, str]:
    """The form (``append``/``replace``) of a list field's mapping and its items, or a problem."""
    for key in value:
        if key not in FORMS:
            close = difflib.get_close_matches(str(key), FORMS, n=1, cutoff=0.6)
            guess = f"did you mean {close[0]!r}? " if close else ""
            return "", [], (
                f"{field}.{str(key)[:60]}: unknown key (value {short(value[key])}); {guess}{field} takes a list "
                "(replacing the parent's), {append: [...]} or {replace: [...]}"
            )
    if len(value) != 1:
        return "", [], f"{field} = {short(value)}: give one of {{append: [...]}} (added to the parent's list) and {{replace: [...]}}"
    ((form, items),) = value.items()
    if not isinstance(items, list):
        return "", [], f"{field}.{form} = {short(items)}: must be a list of components"
    return form, items, ""


def _kind(component: Any) -> str | None:
    kind = component.get("kind") if isinstance(component, dict) else getattr(component, "kind", None)
    return kind if isinstance(kind, str) else None


def _dropped(before: Any, after: Any) -> list[tuple[str, int]]:
    """(kind, index) of each component of ``before`` whose kind ``after`` lacks (counted: two s2t need two)."""
    if not isinstance(before, list) or not isinstance(after, list):
        return []
    left = Counter(kind for kind in map(_kind, after) if kind is not None)
    gone = []
    for i, component in enumerate(before):
        kind = _kind(component)
        if kind is None:
            continue
        if left[kind]:
            left[kind] -= 1
        else:
            gone.append((kind if len(kind) <= 40 else kind[:37] + "...", i))
    return gone


def file_paths(problems: list[str], starts: dict[str, tuple[str, int]]) -> list[str]:
    """Problem lines with a merged path of the first file's own items named as in that file.

    ``masks[2].tau_p`` -> ``masks.append[0].tau_p`` where the file appended after the parent's two masks."""
    out = []
    for problem in problems:
        match = re.match(r"(\w+)\[(\d+)\]", problem)
        form, start = starts.get(match.group(1), ("", 0)) if match else ("", 0)
        if form and int(match.group(2)) >= start:
            problem = f"{match.group(1)}.{form}[{int(match.group(2)) - start}]{problem[match.end():]}"
        out.append(problem)
    return out
