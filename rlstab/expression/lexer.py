"""Tokenizer of the expression language: numbers, names, operators; nothing else gets through.

Whatever is not a number, a name or one of ``< <= > >= == != + - * / ( ) ,`` is refused here, with
a message for the usual suspects: strings, attribute access, subscripts, ``**``, ``=``, ``&``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from rlstab.expression.errors import ExpressionError

MAX_LENGTH = 1000
"""Longest expression accepted, in characters."""

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # smallest positive (subnormal) float32

OPERATORS = ("<=", ">=", "==", "!=", "<", ">", "+", "-", "*", "/", "(", ")", ",")

_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = " \t\r\n"

# Characters (or pairs) that are not in the language, with what to write instead.
_REFUSED = {
    "**": "'**' (power) is not supported; write exp(y * log(x))",
    "//": "'//' is not supported; only + - * / are",
    "=": "'=' is not allowed; compare with '==' (functions take positional arguments only)",
    "'": "strings are not allowed",
    '"': "strings are not allowed",
    ".": "attribute access ('.') is not allowed",
    "[": "subscripts and lists ('[') are not allowed",
    "]": "subscripts and lists (']') are not allowed",
    "{": "'{' is not allowed (no sets, dicts or formatting)",
    "}": "'}' is not allowed (no sets, dicts or formatting)",
    ":": "':' is not allowed (no lambdas, slices or dicts)",
    "&": "'&' is not allowed; write 'and'",
    "|": "'|' is not allowed; write 'or'",
    "~": "'~' is not allowed; write 'not'",
    "!": "'!' is not allowed; write 'not'",
    "^": "'^' is not allowed (no bitwise operators or powers)",
    "%": "'%' is not supported; only + - * / are",
    "@": "'@' is not allowed (no decorators or matrix products)",
    ";": "';' is not allowed: an expression is a single condition",
    "#": "'#' is not allowed (no comments)",
    "\\": "'\\' is not allowed",
    "`": "'`' is not allowed",
    "$": "'$' is not allowed",
    "?": "'?' is not allowed (no conditional expressions)",
}


@dataclass(frozen=True)
class Token:
    """``kind`` is ``number``, ``name``, ``op`` or ``end``; ``offset`` is 0-based."""

    kind: str
    text: str
    offset: int
    value: float = 0.0


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``, ending with an ``end`` token; raises ExpressionError on anything else."""
    return list(iter_tokens(text))


def iter_tokens(text: str) -> Iterator[Token]:
    """The tokens of ``text`` one at a time (so the parser reports the first problem in reading order)."""
    if not isinstance(text, str):
        raise TypeError(f"an expression is a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression too long ({len(text)} characters, at most {MAX_LENGTH})", text, MAX_LENGTH)
    if not text.strip(_SPACE):
        raise ExpressionError("empty expression", text, 0)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            continue
        number = _NUMBER.match(text, i)
        if number:
            yield _number(text, number.group(), i)
            i = number.end()
            if i < n and (text[i].isalnum() or text[i] in "_."):
                raise ExpressionError(f"unexpected {text[i]!r} right after the number {number.group()!r}", text, i)
            continue
        name = _NAME.match(text, i)
        if name:
            yield Token("name", name.group(), i)
            i = name.end()
            continue
        pair = text[i : i + 2]
        if pair in _REFUSED:
            raise ExpressionError(_REFUSED[pair], text, i)
        op = next((o for o in OPERATORS if text.startswith(o, i)), None)
        if op:
            yield Token("op", op, i)
            i += len(op)
            continue
        if c in _REFUSED:
            raise ExpressionError(_REFUSED[c], text, i)
        raise ExpressionError(f"unexpected character {_show(c)}", text, i)
    yield Token("end", "", n)


def _number(text: str, literal: str, offset: int) -> Token:
    value = float(literal)  # the literal matched _NUMBER: digits, '.', an exponent; never inf or nan text
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise ExpressionError(f"number {literal!r} is out of range (at most {FLOAT32_MAX:.4g} in float32)", text, offset)
    if value != 0.0 and abs(value) < FLOAT32_TINY:
        raise ExpressionError(f"number {literal!r} is too small: it rounds to 0 in float32", text, offset)
    if value == 0.0 and re.search(r"[1-9]", literal.split("e")[0].split("E")[0]):
        raise ExpressionError(f"number {literal!r} is too small: it rounds to 0", text, offset)
    return Token("number", literal, offset, value)


def _show(c: str) -> str:
    return repr(c) if c.isascii() and c.isprintable() else f"{c!r} (U+{ord(c):04X})"
