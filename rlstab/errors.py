"""Config errors that name the file, the YAML path, the offending value and what is allowed."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ConfigError(ValueError):
    """An objective that cannot be loaded. ``str(err)`` is one short message per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class StateError(ValueError):
    """A ``load_state_dict`` argument that is not a state this objective saved (names the component and field)."""


def yaml_path(loc: tuple, data: Any) -> str:
    """``('masks', 0, 's2t', 'tau_p')`` -> ``masks[0].tau_p``.

    pydantic puts the discriminator tag of a tagged union into the location; it is not a key of
    the user's YAML, so it is dropped by walking the input alongside the location.
    """
    out, node = "", data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            continue
        if isinstance(node, dict) and part not in node and node.get("kind") == part:
            continue  # the union's tag
        if not isinstance(node, (dict, list)) and out:
            continue  # a member of a plain union (`int | 'max_length'`), not a YAML key
        out += f".{part}" if out else str(part)
        node = node.get(part) if isinstance(node, dict) else None
    return out or "<top level>"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_validation_error(err: ValidationError, data: Any) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        path = yaml_path(e["loc"], data)
        kind, msg = e["type"], e["msg"]
        if kind == "extra_forbidden":
            problems.append(f"{path}: unknown field (value {_short(e['input'])}); check its spelling")
        elif kind == "missing":
            problems.append(f"{path}: required field is missing")
        elif kind == "union_tag_invalid":
            ctx = e.get("ctx", {})
            problems.append(f"{path}.kind = {ctx.get('tag')!r}: unknown kind; allowed: {ctx.get('expected_tags')}")
        elif kind == "union_tag_not_found":
            problems.append(f"{path}: a 'kind' field is required to say which component this is")
        else:
            line = f"{path} = {_short(e['input'])}: "
            same = next((i for i, p in enumerate(problems) if p.startswith(line)), None)
            if same is None:
                problems.append(line + msg)
            else:  # the alternatives of a union, on one line
                problems[same] += f"; or {msg[0].lower()}{msg[1:]}"
    return problems
