"""Registries of component kinds, one per objective field: what ``kind:`` may name in YAML.

The [`Objective`][rlstab.Objective] model, ``rlstab schema``, ``rlstab components``, the
"unknown kind; allowed: ..." errors and the docs' kind lists are all built from these registries.
rlstab's own components are registered by [`register`][rlstab.register], as an in-process plugin
is; installed packages declare theirs in the ``rlstab.components`` entry-point group, loaded once,
lazily, the first time an objective is validated or its schema is asked for. A config only ever
picks among registered kinds: nothing it says is imported or executed.
"""

from rlstab.registry.families import FAMILIES, Family, family_of
from rlstab.registry.store import (
    PluginWarning,
    Registration,
    RegistryError,
    ensure_loaded,
    isolated,
    problems,
    register,
    registrations,
)

__all__ = [
    "FAMILIES",
    "Family",
    "PluginWarning",
    "Registration",
    "RegistryError",
    "ensure_loaded",
    "isolated",
    "family_of",
    "problems",
    "register",
    "registrations",
]
