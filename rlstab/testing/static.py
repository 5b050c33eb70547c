"""The checks that need no batch: YAML round trip, ``describe``/``explain``, and the JSON Schema.

They apply to every family, trainer-executed ones included: a component is first of all a
configuration that must survive being written down (the YAML a run is launched from), explain
itself in one line (``rlstab explain``, the docs), and be what the published JSON Schema says
(editors and CI validate YAML against it before a cluster starts).
"""

from __future__ import annotations

import rlstab
from rlstab.errors import ConfigError
from rlstab.explain import explain
from rlstab.schema import kind_refs, objective_schema
from rlstab.testing.hosting import family_name, host_objective, hosted, is_list_field, position
from rlstab.testing.report import checking

TYPO = "kit_misspelt_field"


def check_yaml_round_trip(component, *, host=None) -> None:
    """``rlstab.load(objective.to_yaml()) == objective``, the component coming back as an equal instance of
    its own class, with the same fingerprint, and writing the same YAML again (``to_yaml`` is stable)."""
    with checking(component, "check_yaml_round_trip"):
        objective = host_objective(component, host)
        text = objective.to_yaml()
        loaded = rlstab.load(text)
        field, index = position(objective, component)
        back = hosted(loaded, field, index)
        assert type(back) is type(component), f"the YAML loads as {type(back).__qualname__}, not {type(component).__qualname__}"
        assert back == component, f"the YAML loads as {back!r} instead of {component!r} (YAML written:\n{text})"
        assert loaded == objective, f"the objective does not survive its YAML:\n{text}"
        assert loaded.fingerprint() == objective.fingerprint(), "the fingerprint changes over a YAML round trip"
        assert loaded.to_yaml() == text, "to_yaml() of the loaded objective differs from the YAML it was loaded from"


def check_describe_and_explain(component, *, host=None) -> None:
    """``describe()`` is one non-empty line (no newline), the same on every call, and
    ``rlstab.explain.explain(objective)`` shows it (``rlstab explain`` is how a user reads what runs)."""
    with checking(component, "check_describe_and_explain"):
        line = component.describe()
        assert isinstance(line, str), f"describe() returned {type(line).__name__}, not a str"
        assert line.strip(), "describe() returned an empty line"
        assert "\n" not in line and "\r" not in line, f"describe() must be one line, got {line!r}"
        assert component.describe() == line, "describe() gives another line when called again"
        explanation = explain(host_objective(component, host))
        assert line in explanation, f"explain() does not show describe()'s line {line!r}:\n{explanation}"


def check_json_schema(component, *, host=None) -> None:
    """The component is what ``rlstab schema`` publishes (``rlstab.schema.objective_schema``), checked by a JSON
    Schema validator.

    - its kind is among the kinds of its field's schema;
    - the hosting objective, dumped as JSON (every field of the component, defaults included, so a
      default outside its own bounds fails here: pydantic does not validate defaults), validates;
    - the component written with its defaults left out validates, and loads as an equal component
      (the defaults a YAML file leaves out are the ones the instance has);
    - a misspelt key is refused by the schema and by ``rlstab.load`` (``extra="forbid"``).
    """
    with checking(component, "check_json_schema"):
        try:
            import jsonschema
        except ImportError as err:  # pragma: no cover - the test extra installs it
            raise AssertionError("needs the jsonschema package (pip install 'rlstab[test]')") from err
        schema = objective_schema()
        field = family_name(component)
        mapping = _kind_refs(schema, field)
        assert component.kind in mapping, (
            f"kind {component.kind!r} is not in the schema of {field!r} (its kinds: {sorted(mapping)}): is it registered?"
        )
        validator = jsonschema.Draft202012Validator(schema)
        own = jsonschema.Draft202012Validator({"$ref": mapping[component.kind], "$defs": schema.get("$defs", {})})
        objective = host_objective(component, host)
        data = objective.model_dump(mode="json")
        _validates(own, component.model_dump(mode="json"), f"its JSON dump (the schema of kind {component.kind!r})")
        _validates(validator, data, "the objective's JSON dump")

        minimal = {"kind": component.kind, **component.model_dump(mode="json", exclude_defaults=True)}
        _validates(validator, _with_component(data, field, minimal), f"the component without its defaults {minimal}")
        loaded = rlstab.load(_with_component(data, field, minimal))
        assert loaded == objective, f"{minimal} (defaults left out) loads as another objective than the component's"

        typo = _with_component(data, field, {**minimal, TYPO: 1})
        assert not validator.is_valid(typo), f"the schema accepts a misspelt key {TYPO!r} (additionalProperties)"
        try:
            rlstab.load(typo)
        except ConfigError:
            pass
        else:
            raise AssertionError(f"rlstab.load accepts a misspelt key {TYPO!r}: the model must forbid extra fields")


def _kind_refs(schema: dict, field: str) -> dict:
    node = schema["properties"][field]
    if is_list_field(field):
        node = node["items"]
    for option in [node, *node.get("anyOf", [])]:
        refs = kind_refs(option)
        if refs:
            return refs
    raise AssertionError(f"the schema of {field!r} selects no component by kind: {node}")


def _with_component(data: dict, field: str, value: dict) -> dict:
    out = dict(data)
    out[field] = [*data[field][:-1], value] if is_list_field(field) else value
    return out


def _validates(validator, document: dict, what: str) -> None:
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "<root>"
        raise AssertionError(f"{what} fails the JSON Schema at {where}: {error.message}")
