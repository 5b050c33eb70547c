"""The fields a model accepts where a config names one it does not, for "did you mean".

pydantic's ``extra_forbidden`` error gives the location of the unknown key, not the fields allowed
there; [`field_names_at`][rlstab.loading.suggest.field_names_at] finds them by walking the model's
annotations along the location (lists, optionals, tagged unions and the registry's families,
whose members are the kinds registered now), so ``masks[0].tau`` is answered with ``tau_p``.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel

from rlstab.registry.store import registrations

_MAX_DEPTH = 64  # annotations nest far less; a bound so a self-referencing model cannot loop


def close_fields(model: type[BaseModel] | None, loc: tuple, key: Any) -> list[str]:
    """Up to three field names accepted at ``loc[:-1]`` (a pydantic location) that are close to ``key``."""
    if model is None or not isinstance(key, str):
        return []
    names = field_names_at(model, loc[:-1])
    return difflib.get_close_matches(key, sorted(names - {key}), n=3, cutoff=0.6)


def field_names_at(model: type[BaseModel], loc: tuple) -> set[str]:
    """The field names (and aliases) of every model that may sit at ``loc`` under ``model``."""
    current: list[Any] = [model]
    for part in loc:
        current = [step for node in current for step in _step(node, part, 0)]
        if not current:
            return set()
    names: set[str] = set()
    for node in current:
        for cls in _models(node, 0):
            for name, field in cls.model_fields.items():
                names.add(field.alias if isinstance(field.alias, str) else name)
    return names


def _step(node: Any, part: Any, depth: int) -> list[Any]:
    """The annotations reached from ``node`` by one location part: a field, a list item, a union's tag."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(part, int):
        inner = _unwrapped(node, depth)
        return [arg for t in inner for arg in _items(t)]
    out: list[Any] = []
    for cls in _models(node, depth):
        fields = {(f.alias if isinstance(f.alias, str) else n): f for n, f in cls.model_fields.items()}
        if part in fields:
            field = fields[part]  # a field with a default keeps its Annotated metadata (a family) apart
            out.append(typing.Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)
        elif _kind(cls) == part:  # the tag of a tagged union, which pydantic puts into the location
            out.append(cls)
    for t in _unwrapped(node, depth):  # a mapping's value (the key is the part)
        if typing.get_origin(t) is dict:
            args = typing.get_args(t)
            out.append(args[1] if len(args) == 2 else Any)
    return out


def _items(t: Any) -> list[Any]:
    origin = typing.get_origin(t)
    if origin in (list, set, frozenset):
        return list(typing.get_args(t)[:1])
    if origin is tuple:
        return [a for a in typing.get_args(t) if a is not Ellipsis]
    return []


def _unwrapped(node: Any, depth: int) -> list[Any]:
    """``node`` without Annotated, Optional and unions: the types it may be; a family becomes its registered kinds."""
    if depth > _MAX_DEPTH:
        return []
    origin = typing.get_origin(node)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(node)
        family = next((m for m in meta if hasattr(m, "base") and hasattr(m, "scope") and hasattr(m, "name")), None)
        if family is not None:
            return _registered(family.name) or [base]
        return _unwrapped(base, depth + 1)
    if origin is typing.Union or origin is types.UnionType:
        return [t for arg in typing.get_args(node) for t in _unwrapped(arg, depth + 1)]
    return [node]


def _models(node: Any, depth: int) -> list[type[BaseModel]]:
    return [t for t in _unwrapped(node, depth) if isinstance(t, type) and issubclass(t, BaseModel)]


def _registered(family: str) -> list[type]:
    return [r.cls for r in registrations(family)]


def _kind(cls: type[BaseModel]) -> Any:
    field = cls.model_fields.get("kind")
    return None if field is None else field.default
