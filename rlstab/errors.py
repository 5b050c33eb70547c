"""Config errors that name the file, the YAML path, the offending value and what is allowed.

Every message is printable as it is: each problem is one line, whatever the file holds. Characters
that are not printable are written as escapes (a newline in a key would forge a second, well-formed
error line; an ANSI escape would reach the terminal raw; a direction override would reorder what
follows), a line is cut at ``MAX_LINE`` characters, and ``str(err)`` shows the first ``MAX_SHOWN``
problems then how many more there are (``err.problems`` keeps them all).
"""

from __future__ import annotations

from typing import Any

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


def count_phrase(n: int, noun: str) -> str:
    """``1 seed``, ``5 seeds``: a count and its noun, plural unless it is one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


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
