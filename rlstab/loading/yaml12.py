"""Objective YAML: plain YAML 1.2 data, read without recursion and within limits.

PyYAML's parser turns text into a stream of events with an explicit state stack; this module
builds the data from those events itself, in a loop, instead of with PyYAML's composer and
constructor, which recurse once per nesting level (so ten thousand ``[`` exhaust the stack) and
expand every alias (so a "billion laughs" document exhausts memory). While it reads it checks the
limits (`Limits`) and stops at the first value past one.

What it reads, and why:

- **YAML 1.2's core schema** for plain scalars: ``true``/``false``, ``null``/``~``, decimal
  integers, ``0o`` octal and ``0x`` hexadecimal integers, floats (``1e-6``, ``.5``, ``.inf``,
  ``.nan``). Everything else is text. So the YAML 1.1 forms that PyYAML's default loader turns
  into numbers or booleans (``1:20`` as base 60, ``yes``/``no``/``on``/``off``, ``1_000``,
  ``0b101``) are text, and a numeric field refuses them with a hint.
- A decimal integer with a leading zero (``010``) is refused: YAML 1.1 reads it as octal (8),
  YAML 1.2 as decimal (10), and another tool may read the same file the other way.
- An integer must fit in 64 bits (a literal of thousands of digits is refused before conversion).
- One document per file; mapping keys are text (field names), never a list, a mapping or a
  number; duplicate keys are refused; ``<<`` merge keys (YAML 1.1) are refused: use ``extends:``.
- No tags at all (``!!python/object``, ``!!str``, ``!custom``): objectives are plain data.
- Anchors and aliases work, each alias counted at its full size against the limit on values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml import events

from rlstab.errors import ConfigError, short
from rlstab.loading.limits import LIMITS, Limits
from rlstab.yaml_core_schema import BOOL, DECIMAL, FLOAT, HEXADECIMAL, INFINITY, NAN, NULL, OCTAL

_INT64 = 2**63


class _Refused(Exception):
    """A problem at an event: ``mark`` is where it starts."""

    def __init__(self, problem: str, mark):
        super().__init__(problem)
        self.problem, self.mark = problem, mark


def resolve_plain(text: str, mark=None) -> Any:
    """The value of a plain (unquoted) scalar under YAML 1.2's core schema."""
    if NULL.fullmatch(text):
        return None
    if text in BOOL:
        return BOOL[text]
    if DECIMAL.fullmatch(text):
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0":
            raise _Refused(
                f"{_cut(text)}: a leading zero is octal in YAML 1.1 and decimal in YAML 1.2; write the number without it",
                mark,
            )
        return _integer(text, int(text) if len(digits) <= 19 else None, mark)
    if OCTAL.fullmatch(text):
        return _integer(text, int(text[2:], 8) if len(text) <= 24 else None, mark)
    if HEXADECIMAL.fullmatch(text):
        return _integer(text, int(text[2:], 16) if len(text) <= 18 else None, mark)
    if FLOAT.fullmatch(text):
        return float(text)
    if INFINITY.fullmatch(text):
        return float("-inf") if text[0] == "-" else float("inf")
    if NAN.fullmatch(text):
        return float("nan")
    return text


def _integer(text: str, value: int | None, mark) -> int:
    if value is None or not -_INT64 <= value < _INT64:
        raise _Refused(f"{_cut(text)}: integer out of range (objective integers fit in 64 bits)", mark)
    return value


@dataclass
class _Open:
    """A mapping or list being read: its value, where it starts, its anchor and size so far."""

    value: dict | list
    mark: Any
    anchor: str | None
    size: int = 1
    key: str | None = None  # a mapping's key awaiting its value
    awaiting_key: bool = True


@dataclass
class _Builder:
    """Plain data from parser events (one document), within ``limits``."""

    limits: Limits
    stack: list[_Open] = field(default_factory=list)
    anchors: dict[str, tuple[Any, int]] = field(default_factory=dict)
    open_anchors: set[str] = field(default_factory=set)
    values: int = 0
    documents: int = 0
    result: Any = None

    def feed(self, event) -> None:
        if isinstance(event, events.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise _Refused("a second YAML document ('---'): an objective file holds one", event.start_mark)
        elif isinstance(event, events.ScalarEvent):
            self._refuse_tag(event)
            value = resolve_plain(event.value, event.start_mark) if event.style is None else event.value
            self._add(value, 1, event, event.anchor)
        elif isinstance(event, events.AliasEvent):
            if event.anchor in self.open_anchors:
                raise _Refused(f"alias *{_cut(event.anchor)} refers to a value that contains it", event.start_mark)
            if event.anchor not in self.anchors:
                name = _cut(event.anchor)
                raise _Refused(f"alias *{name} has no anchor &{name} before it", event.start_mark)
            self._add(*self.anchors[event.anchor], event, None)
        elif isinstance(event, events.MappingStartEvent | events.SequenceStartEvent):
            self._refuse_tag(event)
            if self.stack and isinstance(self.stack[-1].value, dict) and self.stack[-1].awaiting_key:
                raise _Refused("a mapping key that is a list or a mapping: keys are field names", event.start_mark)
            if len(self.stack) >= self.limits.depth:
                raise _Refused(f"nested deeper than {self.limits.depth} levels (the limit on nesting)", event.start_mark)
            self._count(1, event)
            if event.anchor is not None:
                self.open_anchors.add(event.anchor)
            value = {} if isinstance(event, events.MappingStartEvent) else []
            self.stack.append(_Open(value, event.start_mark, event.anchor))
        elif isinstance(event, events.MappingEndEvent | events.SequenceEndEvent):
            done = self.stack.pop()
            if done.anchor is not None:
                self.open_anchors.discard(done.anchor)
                self.anchors[done.anchor] = (done.value, done.size)
            self._place(done.value, done.size, done.mark, plain=False)

    def _refuse_tag(self, event) -> None:
        if event.tag is not None:
            tag = event.tag.replace("tag:yaml.org,2002:", "!!", 1)
            raise _Refused(f"YAML tag {short(tag)} refused: objectives are plain data, without tags", event.start_mark)

    def _count(self, size: int, event) -> None:
        self.values += size
        if self.values > self.limits.values:
            raise _Refused(
                f"more than {self.limits.values:,} values, counting each alias in full (the limit on values)",
                event.start_mark,
            )

    def _add(self, value: Any, size: int, event, anchor: str | None) -> None:
        """A scalar (with its ``anchor``) or an alias: count it, remember the anchor, place it."""
        self._count(size, event)
        if anchor is not None:
            self.anchors[anchor] = (value, size)
        plain = isinstance(event, events.ScalarEvent) and event.style is None
        self._place(value, size, event.start_mark, plain)

    def _place(self, value: Any, size: int, mark, plain: bool) -> None:
        """Put a finished value into the open mapping or list (``mark``: where the value starts)."""
        if not self.stack:
            self.result = value
            return
        parent = self.stack[-1]
        parent.size += size
        if isinstance(parent.value, list):
            if len(parent.value) >= self.limits.items:
                raise _Refused(f"a list of more than {self.limits.items} items (the limit on list items)", mark)
            parent.value.append(value)
        elif parent.awaiting_key:
            parent.key = self._key(value, parent, mark, plain)
            parent.awaiting_key = False
        else:
            parent.value[parent.key] = value
            parent.awaiting_key = True

    def _key(self, key: Any, parent: _Open, mark, plain: bool) -> str:
        if not isinstance(key, str):
            raise _Refused(f"key {short(key)} is not text: keys are field names", mark)
        if key == "<<" and plain:
            raise _Refused(
                "'<<' merge keys are YAML 1.1, and objectives are YAML 1.2: use extends:, or write the fields out", mark
            )
        if key in parent.value:
            raise _Refused(f"duplicate key {short(key)}", mark)
        if len(parent.value) >= self.limits.keys:
            raise _Refused(f"a mapping of more than {self.limits.keys} keys (the limit on keys)", mark)
        return key


def parse_yaml(text: str, source: str, limits: Limits = LIMITS) -> Any:
    """The plain data of one YAML 1.2 document; a [`ConfigError`][rlstab.ConfigError] naming line and column otherwise."""
    builder = _Builder(limits)
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            builder.feed(event)
    except _Refused as err:
        raise ConfigError(source, [f"{_where(err.mark)}{err.problem}"]) from None
    except yaml.reader.ReaderError as err:
        line, column = _line_column(text, err.position)
        character = chr(err.character) if isinstance(err.character, int) else str(err.character)
        raise ConfigError(
            source, [f"malformed YAML: line {line}, column {column}: character {character!r} is not allowed in YAML text"]
        ) from None
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(source, [f"malformed YAML: {_where(getattr(err, 'problem_mark', None))}{problem}"]) from None
    return builder.result


def _cut(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _where(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _line_column(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - before.rfind("\n")
