"""The registered kinds, how they get there (``register``, entry points), and what went wrong on the way.

Entry points of the group ``rlstab.components`` (rlstab's own components included) are loaded
once, the first time the registry is needed: an objective validated, a schema or a listing asked
for, or ``register`` called. A plugin that fails to import, or whose kind is already taken, is
refused with one line naming its distribution (and, for a collision, both origins): a
``PluginWarning`` at load, kept in ``problems()``, and repeated in the error of a config that
names the kind. In-process registrations are marked in the environment (``RLSTAB_IN_PROCESS_KINDS``)
so that a child process, such as a Ray worker started from the driver, that does not know such a
kind can say why.
"""

from __future__ import annotations

import os
import re
import typing
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points

from pydantic import BaseModel

from rlstab.components import Component
from rlstab.errors import ConfigError
from rlstab.lazy import no_numpy_warning
from rlstab.registry.bases import BASES, family_name_of

GROUP = "rlstab.components"
IN_PROCESS_ENV = "RLSTAB_IN_PROCESS_KINDS"
_KIND = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class RegistryError(ConfigError):
    """A component class that cannot be registered (not a component, no valid kind, a kind taken)."""

    def __init__(self, origin: str, message: str):
        super().__init__(origin, [message])


class PluginWarning(UserWarning):
    """An installed plugin refused at load (import failure, invalid class, kind taken)."""


@dataclass(frozen=True)
class Registration:
    """One kind: its family, class and origin (``rlstab 0.1.0``, ``rlstab-wreinforce 0.1.0``, ``rlstab.register in my_module``)."""

    family: str
    kind: str
    cls: type[Component]
    origin: str
    distribution: str | None  # None: registered in-process


_kinds: dict[str, dict[str, Registration]] = {name: {} for name in BASES}
_problems: list[tuple[str | None, str]] = []  # (entry point name or None, message)
_models: list[type[BaseModel]] = []
_state = {"loaded": False, "loading": False}


def register(cls: type[Component]) -> type[Component]:
    """Register a component class in-process (notebooks, tests); returns ``cls``, so it works as a decorator.

    Raises [`RegistryError`][rlstab.registry.RegistryError] for a class that is no family's
    component, has no valid ``kind``, or whose kind another class holds (naming both origins).
    Registering the same class again does nothing; a class redefined in the same module under the
    same name (a notebook cell run twice) replaces the earlier one.

    Ray workers do not see in-process registrations: install a package declaring the class in the
    ``rlstab.components`` entry-point group for runs with workers.
    """
    ensure_loaded()
    reg = _registration(cls, f"rlstab.register in {getattr(cls, '__module__', '?')}", None)
    held = _kinds[reg.family].get(reg.kind)
    redefined = held is not None and held.distribution is None and _same_name(held.cls, cls)
    if held is not None and held.cls is not cls and not redefined:
        raise RegistryError(reg.origin, _collision(reg, held))
    if held is None or held.cls is not cls:
        _kinds[reg.family][reg.kind] = reg
        _mark_in_process(reg)
        _schemas_changed()
    return cls


@contextmanager
def isolated() -> Iterator[None]:
    """Undo, on exit, every registration made inside (tests that register classes of their own)."""
    ensure_loaded()
    saved = {name: dict(kinds) for name, kinds in _kinds.items()}
    marked = os.environ.get(IN_PROCESS_ENV)
    try:
        yield
    finally:
        changed = saved != _kinds
        for name, kinds in saved.items():
            _kinds[name] = kinds
        if marked is None:
            os.environ.pop(IN_PROCESS_ENV, None)
        else:
            os.environ[IN_PROCESS_ENV] = marked
        if changed:
            _schemas_changed()


def ensure_loaded() -> None:
    """Load the ``rlstab.components`` entry points, once (a nested call while loading returns at once)."""
    if _state["loaded"] or _state["loading"]:
        return
    _state["loading"] = True
    try:
        parsed: dict[int, tuple[str, str]] = {}  # METADATA parsed once per distribution, not per entry point
        found = []
        for ep in entry_points(group=GROUP):
            if id(ep.dist) not in parsed:
                parsed[id(ep.dist)] = _name_and_version(ep.dist)
            found.append((parsed[id(ep.dist)], ep))
        for (name, version), ep in sorted(found, key=lambda item: (item[0][0] != "rlstab", item[0][0], item[1].name)):
            _load(ep, name, version)
    finally:
        _state["loading"], _state["loaded"] = False, True
    _schemas_changed()  # a plugin that validated an objective while it was imported saw part of the registry


def registrations(family: str | None = None) -> list[Registration]:
    """Every registration (of one family), plugins loaded first."""
    ensure_loaded()
    names = [family] if family is not None else list(_kinds)
    return [reg for name in names for reg in _kinds[name].values()]


def lookup(family: str, kind: str) -> Registration | None:
    ensure_loaded()
    return _kinds[family].get(kind) if isinstance(kind, str) else None


def problems() -> list[str]:
    """One line per plugin refused at load."""
    ensure_loaded()
    return [message for _, message in _problems]


def why_unknown(family: str, kind: str) -> str:
    """Why ``kind`` may be missing from ``family``: a plugin refused at load, or a parent's in-process registration."""
    ensure_loaded()
    for name, message in _problems:
        if name == kind:
            return f" ({message})"
    marked = os.environ.get(IN_PROCESS_ENV, "").split()
    for entry in marked:
        fam_kind, _, module = entry.partition("@")
        if fam_kind == f"{family}/{kind}":
            return (
                f" ({kind!r} was registered with rlstab.register in {module} by a parent process, such as a Ray driver: "
                f"in-process registrations do not reach other processes; install a package that declares it in the "
                f"{GROUP!r} entry-point group on every node)"
            )
    return ""


def rebuild_on_change(model: type[BaseModel]) -> type[BaseModel]:
    """Rebuild ``model``'s schema whenever a kind is registered (the Objective model does this)."""
    _models.append(model)
    return model


def _name_and_version(dist) -> tuple[str, str]:
    if dist is None:
        return "?", "?"
    meta = dist.metadata
    return meta["Name"] or "?", meta["Version"] or "?"


def _load(ep, dist: str, version: str) -> None:
    where = f"{dist} {version}"
    origin = f"{where} (entry point {ep.name} = {ep.value})"
    try:
        with no_numpy_warning():  # a plugin may import torch
            cls = ep.load()
    except Exception as err:  # noqa: BLE001 - any failure of a plugin's import is reported, not raised
        _refuse(ep.name, f"plugin {ep.name!r} of {where} failed to import {ep.value}: {type(err).__name__}: {err}")
        return
    try:
        reg = _registration(cls, origin, dist)
    except RegistryError as err:
        _refuse(ep.name, f"plugin {ep.name!r} of {where}: {err.problems[0]}")
        return
    held = _kinds[reg.family].get(reg.kind)
    if held is not None and held.cls is not reg.cls:
        _refuse(ep.name, f"plugin {ep.name!r} refused: {_collision(reg, held)}")
        return
    _kinds[reg.family][reg.kind] = reg


def _refuse(name: str, message: str) -> None:
    _problems.append((name, message))
    warnings.warn(message, PluginWarning, stacklevel=4)


def _registration(cls, origin: str, distribution: str | None) -> Registration:
    bases = ", ".join(f"{base.__module__}.{base.__name__} ({name})" for name, (base, _) in BASES.items())
    if not isinstance(cls, type) or not issubclass(cls, Component):
        raise RegistryError(origin, f"{cls!r} is not a component class; derive from one of {bases}")
    family = family_name_of(cls)
    if family is None:
        raise RegistryError(origin, f"{cls.__name__} derives from no family's base; derive from one of {bases}")
    field = cls.model_fields.get("kind")
    kind = None if field is None else field.default
    if not isinstance(kind, str) or typing.get_args(field.annotation) != (kind,):
        raise RegistryError(
            origin, f"{cls.__name__} needs a field `kind: Literal['<kind>'] = '<kind>'` naming it in YAML"
        )
    if not _KIND.fullmatch(kind):
        raise RegistryError(
            origin, f"{cls.__name__}.kind = {kind!r}: a kind is 1-64 of a-z, 0-9, '_' and '-', starting with a letter or digit"
        )
    return Registration(family, kind, cls, origin, distribution)


def _collision(new: Registration, held: Registration) -> str:
    return (
        f"{new.family} kind {new.kind!r} of {new.cls.__module__}.{new.cls.__name__} from {new.origin} is already "
        f"registered by {held.cls.__module__}.{held.cls.__name__} from {held.origin}"
    )


def _same_name(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _mark_in_process(reg: Registration) -> None:
    entry = f"{reg.family}/{reg.kind}@{reg.cls.__module__}"
    marked = os.environ.get(IN_PROCESS_ENV, "").split()
    if entry not in marked:
        os.environ[IN_PROCESS_ENV] = " ".join([*marked, entry])


def _schemas_changed() -> None:
    for model in _models:
        if model.__pydantic_complete__:
            model.model_rebuild(force=True)
