"""The wording of a config's validation errors: the YAML path, the offending value, what is allowed.

pydantic reports a location tuple and a message per error; [`describe_validation_error`][rlstab.loading.wording.describe_validation_error]
turns them into the one-line problems of a [`ConfigError`][rlstab.ConfigError] (``masks[0].tau_p = 1.5:
Input should be less than 1``), joins a union's alternatives, adds a hint where YAML 1.1 and 1.2
read a scalar differently, says why an unknown ``kind`` is unknown (a plugin refused at load), names the
closest fields to an unknown one, and says that a NaN or infinity is not a number rather than that it fails a bound.
It sits with the loader, its one user besides the lab's regime files, above the registry it asks.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from rlstab.errors import short
from rlstab.loading.suggest import close_fields
from rlstab.registry.families import FAMILIES
from rlstab.registry.store import why_unknown


def _key(part: Any) -> str:
    text = str(part)
    return text if len(text) <= 60 else text[:57] + "..."


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
        out += f".{_key(part)}" if out else _key(part)
        node = node.get(part) if isinstance(node, dict) else None
    return out or "<top level>"


# Plain scalars that YAML 1.1 reads as numbers or booleans and YAML 1.2 (which rlstab reads) as text.
_YAML11_HINTS = (
    (re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?"), "a YAML 1.1 base-60 number"),
    (re.compile(r"y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF"), "a YAML 1.1 boolean; write true or false"),
    (re.compile(r"[-+]?0b[01_]+"), "a YAML 1.1 binary number"),
    (
        re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"),
        "a YAML 1.1 number with '_'; write it without",
    ),
)


def yaml11_hint(value: Any) -> str:
    """Why a text value may have been meant as a number or boolean (objectives are YAML 1.2), or ""."""
    if isinstance(value, str):
        for pattern, what in _YAML11_HINTS:
            if pattern.fullmatch(value) and ("_" in value or "with '_'" not in what):
                return f" ({value!r} is text in YAML 1.2, not {what})"
    return ""


_BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def describe_validation_error(err: ValidationError, data: Any, model: type[BaseModel] | None = None) -> list[str]:
    """pydantic's errors for ``data`` as rlstab's problem lines: the YAML path, the offending value, what is
    allowed (a union's alternatives on one line), and why an unknown kind is unknown.

    ``model``: the model ``data`` was validated against; with it an unknown field is answered with the
    closest fields allowed there (``masks[0].tau: unknown field ...; did you mean 'tau_p'?``)."""
    problems: list[str] = []
    lines: dict[str, int] = {}  # "path = value: " -> index in problems, to join a union's alternatives
    hints: dict[int, str] = {}
    for e in err.errors(include_url=False):
        path = yaml_path(e["loc"], data)
        kind, msg = e["type"], e["msg"]
        if kind == "extra_forbidden":
            close = close_fields(model, e["loc"], e["loc"][-1] if e["loc"] else None)
            guess = f"did you mean {' or '.join(map(repr, close))}?" if close else "check its spelling"
            problems.append(f"{path}: unknown field (value {short(e['input'])}); {guess}")
        elif kind in _BOUNDS and _not_finite(e["input"]):  # NaN fails every bound: say why, not "less than 1"
            problems.append(f"{path} = {short(e['input'])}: not a finite number; {msg[0].lower()}{msg[1:]}")
        elif kind == "missing":
            problems.append(f"{path}: required field is missing")
        elif kind == "union_tag_invalid":
            ctx = e.get("ctx", {})
            problems.append(
                f"{path}.kind = {short(ctx.get('tag'))}: unknown kind; {_allowed(e['loc'], ctx)}"
                + _why_unknown(e["loc"], ctx.get("tag"))
            )
        elif kind == "union_tag_not_found":
            problems.append(f"{path}: a 'kind' field is required to say which component this is")
        else:
            line = f"{path} = {short(e['input'])}: "
            same = lines.get(line)
            if same is None:
                lines[line] = len(problems)
                problems.append(line + msg)
                hints[len(problems) - 1] = yaml11_hint(e["input"])
            else:  # the alternatives of a union, on one line
                problems[same] += f"; or {msg[0].lower()}{msg[1:]}"
    return [p + hints.get(i, "") for i, p in enumerate(problems)]


_LISTED_KINDS = 8
"""A family with more kinds than this is not listed in full: the closest ones are named instead."""


def _allowed(loc: tuple, ctx: dict) -> str:
    """``allowed: 'a', 'b'`` for a small family; else the kinds closest to the unknown one and where to see them all."""
    tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
    if len(tags) <= _LISTED_KINDS:
        return f"allowed: {ctx.get('expected_tags')}"
    family = loc[0] if loc and loc[0] in FAMILIES else None
    tag = ctx.get("tag")
    close = difflib.get_close_matches(tag, tags, n=3, cutoff=0.7) if isinstance(tag, str) else []
    listing = f"`rlstab components --family {family}`" if family else "`rlstab components`"
    guess = f"did you mean {', '.join(map(repr, close))}? " if close else ""
    return f"{guess}{listing} lists its {len(tags)} kinds"


def _why_unknown(loc: tuple, kind: Any) -> str:
    """A plugin refused at load, or a kind registered in-process by a parent process, that explains ``kind``."""
    family = loc[0] if loc else None
    return why_unknown(family, kind) if family in FAMILIES and isinstance(kind, str) else ""
