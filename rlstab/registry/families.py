"""The families: one per objective field that names a component, each with its base class.

A family is also the pydantic type of its field (``Annotated[Mask, FAMILIES["masks"]]``): its
schema is a tagged union on ``kind`` over the kinds registered when the schema is built, so the
objective model, its JSON Schema and its "unknown kind; allowed: ..." errors follow the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError, core_schema

from rlstab.components import Component
from rlstab.registry.bases import BASES, family_name_of
from rlstab.registry.store import ensure_loaded, lookup, registrations


@dataclass(frozen=True, eq=False)
class Family:
    """The kinds an objective field accepts: components deriving from ``base``.

    Attributes:
        name: the objective field (``masks``), also the family's name in messages and listings.
        base: the class every component of the family derives from, whose methods it implements.
        scope: where it runs: ``loss`` (every trainer, through the compiled loss), ``step`` (gather,
            once per step), or ``trainer`` (executed by a trainer that knows the kind).
    """

    name: str
    base: type[Component]
    scope: str

    @property
    def annotation(self) -> Any:
        return Annotated[self.base, self]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        ensure_loaded()
        registered = sorted(registrations(self.name), key=lambda r: r.kind)
        if not registered:
            return core_schema.no_info_plain_validator_function(self._nothing_registered)
        choices = {r.kind: handler.generate_schema(r.cls) for r in registered}
        return core_schema.tagged_union_schema(choices, discriminator="kind")

    def instance_problem(self, value: Any) -> PydanticCustomError | None:
        """Why a Python component object cannot fill this field (another family, a kind nobody registered), or None.

        Asked only after validation failed, so the tagged union stays all Rust on the way that succeeds.
        """
        if not isinstance(value, Component):
            return None
        if not isinstance(value, self.base):
            return PydanticCustomError(
                "wrong_family", "{cls} is not a component of {family} (its base is {base})",
                {"cls": type(value).__name__, "family": self.name, "base": self.base.__name__},
            )
        known = lookup(self.name, getattr(value, "kind", None))
        if known is None or not isinstance(value, known.cls):
            return PydanticCustomError(
                "unregistered_kind",
                "{cls} (kind '{kind}') is not registered: call rlstab.register({cls}) first, or declare it "
                "in the 'rlstab.components' entry-point group of an installed package",
                {"cls": type(value).__name__, "kind": str(getattr(value, "kind", None))},
            )
        return None

    def _nothing_registered(self, value: Any) -> Any:
        raise PydanticCustomError(
            "no_kinds", "no {family} kind is registered (rlstab's own entry points are missing: install rlstab with pip)",
            {"family": self.name},
        )


FAMILIES: dict[str, Family] = {name: Family(name, base, scope) for name, (base, scope) in BASES.items()}


def family_of(cls: type) -> Family | None:
    """The family whose base ``cls`` derives from, or None."""
    name = family_name_of(cls)
    return None if name is None else FAMILIES[name]


def with_instance_problems(err: ValidationError, data: dict) -> ValidationError:
    """``err``, where a Python component object was refused, with the reason (another family, not registered)."""
    lines, changed = [], False
    for e in err.errors(include_url=False):
        loc, value = e["loc"], data.get(e["loc"][0]) if e["loc"] else None
        if len(loc) > 1 and isinstance(loc[1], int) and isinstance(value, list) and loc[1] < len(value):
            value = value[loc[1]]
        problem = FAMILIES[loc[0]].instance_problem(value) if loc and loc[0] in FAMILIES else None
        changed |= problem is not None
        detail = {"type": problem or e["type"], "loc": loc, "input": e["input"]}
        if problem is None and "ctx" in e:
            detail["ctx"] = e["ctx"]
        lines.append(detail)
    return ValidationError.from_exception_data(err.title, lines) if changed else err
