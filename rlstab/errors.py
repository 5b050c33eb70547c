"""Config errors that name the file, the YAML path, the offending value and what is allowed.

Every message is printable as it is: each problem is one line, whatever the file holds. Characters
that are not printable are written as escapes (a newline in a key would forge a second, well-formed
error line; an ANSI escape would reach the terminal raw; a direction override would reorder what
follows), a line is cut at ``MAX_LINE`` characters, and ``str(err)`` shows the first ``MAX_SHOWN``
problems then how many more there are (``err.problems`` keeps them all).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

MAX_SHOWN = 10
"""Problems shown by ``str(ConfigError)`` (and so by ``rlstab validate``) before "... and N more"."""
MAX_LINE = 1000
"""Characters of one problem line; longer ones are cut."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    if c.isprintable():
        return c
    code = ord(c)
    return _NAMED.get(c) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def one_line(text: str) -> str:
    """``text`` with every character that is not printable escaped (``\\n``, ``\\x1b``, ``\\u202e``), cut at ``MAX_LINE``.

    Not printable, as Python's ``str.isprintable`` says: controls, format characters (invisible
    direction overrides), separators other than the space, surrogates, private-use and unassigned
    code points.
    """
    if not text.isprintable():
        text = "".join(map(_escape, text))
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def short(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut at ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class ConfigError(ValueError):
    """An objective that cannot be loaded. ``str(err)`` is one short line per problem.

    Attributes:
        source: the file (or ``preset NAME``, ``<yaml text>``, ``<dict>``) the problems are in.
        problems: every problem, one line each, without the source.
    """

    def __init__(self, source: str, problems: list[str]):
        self.source = one_line(str(source))
        self.problems = [one_line(p) for p in problems]
        lines = [f"{self.source}: {p}" for p in self.problems[:MAX_SHOWN]]
        if len(self.problems) > MAX_SHOWN:
            lines.append(f"{self.source}: ... and {len(self.problems) - MAX_SHOWN} more problems")
        super().__init__("\n".join(lines))


class StateError(ValueError):
    """A ``load_state_dict`` argument that is not a state this objective saved (names the component and field)."""


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


def describe_validation_error(err: ValidationError, data: Any) -> list[str]:
    problems: list[str] = []
    lines: dict[str, int] = {}  # "path = value: " -> index in problems, to join a union's alternatives
    hints: dict[int, str] = {}
    for e in err.errors(include_url=False):
        path = yaml_path(e["loc"], data)
        kind, msg = e["type"], e["msg"]
        if kind == "extra_forbidden":
            problems.append(f"{path}: unknown field (value {short(e['input'])}); check its spelling")
        elif kind == "missing":
            problems.append(f"{path}: required field is missing")
        elif kind == "union_tag_invalid":
            ctx = e.get("ctx", {})
            problems.append(
                f"{path}.kind = {short(ctx.get('tag'))}: unknown kind; allowed: {ctx.get('expected_tags')}"
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


def _why_unknown(loc: tuple, kind: Any) -> str:
    """A plugin refused at load, or a kind registered in-process by a parent process, that explains ``kind``."""
    from rlstab.registry.families import FAMILIES
    from rlstab.registry.store import why_unknown

    family = loc[0] if loc else None
    return why_unknown(family, kind) if family in FAMILIES and isinstance(kind, str) else ""
