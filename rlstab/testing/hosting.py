"""The objective that hosts a component under test: the smallest one that runs it.

A component is never checked on its own: the compiled objective is what trainers run, and it is
where a component's declarations (``reads``, ``selection``, its state) are acted on. So the kit
puts the component into its family's field of a minimal objective, ``advantage: grpo``,
``surrogate: ppo_clip``, ``aggregation: token-mean`` over kept tokens, and checks that objective.
In a list field (``masks``, ``reweighters``, ``regularisers``, ``reward_shaping``) the component
is appended; any other field is replaced. A component that needs companions (another field set,
a particular estimator) is checked in a ``host`` of its author's choosing: anything
[`rlstab.load`][rlstab.load] accepts, to which the component is added the same way.
"""

from __future__ import annotations

import typing

import rlstab
from rlstab.objective import Objective
from rlstab.registry import FAMILIES, family_of


def family_name(component) -> str:
    """The objective field (= family) of ``component``, or an AssertionError for a class of no family."""
    fam = family_of(type(component))
    if fam is None:
        bases = ", ".join(f"{f.base.__name__} ({f.name})" for f in FAMILIES.values())
        raise AssertionError(f"{type(component).__name__} derives from no family's base class; derive from one of {bases}")
    return fam.name


def is_list_field(field: str) -> bool:
    """Whether the objective's ``field`` holds a list of components (``masks``) or one (``surrogate``)."""
    return typing.get_origin(Objective.model_fields[field].annotation) is list


def default_host() -> Objective:
    """``aggregation: token-mean`` over kept tokens, every other field at its default (grpo, ppo_clip)."""
    return rlstab.load({"aggregation": {"kind": "token-mean", "count": "kept"}})


def host_objective(component, host=None, **fields) -> Objective:
    """``host`` (default: ``default_host()``) with ``component`` in its family's field, and ``fields`` replaced.

    ``fields`` let a check change the host around the component (the silenced-token check runs
    under ``surrogate: none``); they never replace the component's own field.
    """
    field = family_name(component)
    base = default_host() if host is None else rlstab.load(host)
    values = {name: getattr(base, name) for name in Objective.model_fields}
    values.update(fields)
    if is_list_field(field):
        values[field] = [*values[field], component]
    else:
        values[field] = component
    return Objective(**values)


def position(objective: Objective, component) -> tuple[str, int | None]:
    """``(field, index)`` of ``component`` in ``objective``: the last of a list field (it was appended)."""
    field = family_name(component)
    if is_list_field(field):
        return field, len(getattr(objective, field)) - 1
    return field, None


def component_label(objective: Objective, component) -> str:
    """The label the compiled objective uses for it: ``masks[0] (s2t)``, ``surrogate (bapo)``."""
    field, index = position(objective, component)
    where = field if index is None else f"{field}[{index}]"
    return f"{where} ({component.kind})"


def hosted(objective: Objective, field: str, index: int | None):
    """The component at ``(field, index)`` of ``objective`` (the one a YAML round trip brought back)."""
    value = getattr(objective, field)
    return value if index is None else value[index]


def components_of(objective: Objective) -> list:
    """Every component of ``objective``, field by field (what a spawned process must be able to rebuild)."""
    found = []
    for name in FAMILIES:
        value = getattr(objective, name)
        if value is None:
            continue
        found += list(value) if isinstance(value, list) else [value]
    return found
