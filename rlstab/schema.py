"""The JSON Schema of objective files (``rlstab schema``), in standard JSON Schema 2020-12.

pydantic writes each component field as ``oneOf`` over the kinds plus OpenAPI's ``discriminator``,
which JSON Schema validators ignore: a wrong value in one component then fails every alternative,
and ``jsonschema``'s ``best_match`` (and an editor) blames the wrong thing ("'eps_high' was
unexpected" for ``eps_high: wide``). Here each such field says it in JSON Schema's own words: an
object whose ``kind`` is one of the registered kinds, and ``if kind is k then`` the schema of
``k``. A validator then checks exactly one component's fields and names the mistake: a wrong type,
a misspelt field, an unknown kind.
"""

from __future__ import annotations

from typing import Any

from rlstab.objective import Objective
from rlstab.presets import preset_names

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def objective_schema() -> dict[str, Any]:
    """The schema of an objective file: every registered kind, ``extends``, nothing required (``extends`` may supply it)."""
    schema = _select_by_kind(Objective.model_json_schema())
    schema["properties"]["extends"] = {
        "type": "string",
        "description": f"A preset ({', '.join(preset_names())}) or a YAML file to start from.",
    }
    schema["required"] = []
    return {"$schema": DIALECT, **schema}


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
