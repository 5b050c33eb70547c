"""The JSON Schema of objective files (``rlstab schema``), in standard JSON Schema 2020-12.

pydantic writes each component field as ``oneOf`` over the kinds plus OpenAPI's ``discriminator``,
which JSON Schema validators ignore: a wrong value in one component then fails every alternative,
and ``jsonschema``'s ``best_match`` (and an editor) blames the wrong thing ("'eps_high' was
unexpected" for ``eps_high: wide``). Here each such field says it in JSON Schema's own words: an
object whose ``kind`` is one of the registered kinds, and ``if kind is k then`` the schema of
``k``. A validator then checks exactly one component's fields and names the mistake: a wrong type,
a misspelt field, an unknown kind.

Each list of components (``masks``, ...) is a list, or the mapping ``{append: [...]}`` or
``{replace: [...]}`` of [`rlstab.loading.lists`][rlstab.loading.lists]: its ``items`` apply to an
array, its ``properties`` (one of those keys, each the same list) to an object.
"""

from __future__ import annotations

from typing import Any

from rlstab.loading.lists import FORMS, component_lists
from rlstab.objective import Objective
from rlstab.presets import preset_names

DIALECT = "https://json-schema.org/draft/2020-12/schema"
LIST_FORMS = (
    "A list replaces the list of the objective it extends (and rlstab validate and explain name the components "
    "it drops); {append: [...]} adds to that list; {replace: [...]} replaces it without a note."
)


def objective_schema() -> dict[str, Any]:
    """The schema of an objective file: every registered kind, ``extends``, nothing required (``extends`` may supply it)."""
    schema = _select_by_kind(Objective.model_json_schema())
    schema["properties"]["extends"] = {
        "type": "string",
        "description": f"A preset ({', '.join(preset_names())}) or a YAML file to start from.",
    }
    schema["required"] = []
    for field in component_lists():
        _list_forms(schema, field)
    return {"$schema": DIALECT, **schema}


def _list_forms(schema: dict[str, Any], field: str) -> None:
    """``field``'s list, or ``{append: list}`` or ``{replace: list}``. ``items`` stays where it was (editors and the
    plugin kit read it): it applies to an array only, as the mapping's keywords apply to an object only."""
    node = schema["properties"][field]
    listed = {"type": "array", "items": {"$ref": f"#/properties/{field}/items"}}
    node.update({
        "description": f"{node['description']} {LIST_FORMS}",
        "type": ["array", "object"],
        "properties": {form: listed for form in FORMS},
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
    })


def kind_refs(node: dict[str, Any]) -> dict[str, str]:
    """``{kind: "#/$defs/..."}`` of a component field's schema as ``objective_schema`` writes it."""
    return {rule["if"]["properties"]["kind"]["const"]: rule["then"]["$ref"] for rule in node.get("allOf", [])}


def _select_by_kind(node: Any) -> Any:
    if isinstance(node, list):
        return [_select_by_kind(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _select_by_kind(v) for k, v in node.items()}
    discriminator = node.pop("discriminator", None)
    if discriminator is None:
        return node
    node.pop("oneOf", None)
    key, mapping = discriminator["propertyName"], discriminator["mapping"]
    node.update(
        type="object",
        required=[key],
        properties={key: {"enum": sorted(mapping)}},
        allOf=[
            {"if": {"properties": {key: {"const": kind}}, "required": [key]}, "then": {"$ref": ref}}
            for kind, ref in sorted(mapping.items())
        ],
    )
    return node
