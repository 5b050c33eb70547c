"""Canonical text of a syntax tree: one space around operators, only the parentheses it needs.

Used for ``describe()``, error messages and metric names; parsing the text gives back the same tree.
"""

from __future__ import annotations

from rlstab.expression.nodes import (
    Arithmetic,
    Boolean,
    Call,
    Compare,
    Feature,
    Logical,
    Negate,
    Node,
    Not,
    Number,
)

_PRECEDENCE = {"or": 1, "and": 2, "not": 3, "compare": 4, "+": 5, "-": 5, "*": 6, "/": 6, "negate": 7, "atom": 8}


def number_text(value: float) -> str:
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def to_text(node: Node, parent: int = 0) -> str:
    """``node`` as expression text, parenthesised if its precedence is below ``parent``'s."""
    if isinstance(node, Number):
        text, own = number_text(node.value), (_PRECEDENCE["negate"] if node.value < 0 else _PRECEDENCE["atom"])
    elif isinstance(node, Boolean):
        text, own = ("(0 == 0)" if node.value else "(0 != 0)"), _PRECEDENCE["atom"]
    elif isinstance(node, Feature):
        text, own = node.name, _PRECEDENCE["atom"]
    elif isinstance(node, Call):
        text, own = f"{node.name}({', '.join(to_text(a) for a in node.args)})", _PRECEDENCE["atom"]
    elif isinstance(node, Negate):
        own = _PRECEDENCE["negate"]
        text = "-" + to_text(node.operand, own)
    elif isinstance(node, Arithmetic):
        own = _PRECEDENCE[node.op]
        text = f"{to_text(node.left, own)} {node.op} {to_text(node.right, own + 1)}"
    elif isinstance(node, Compare):
        own = _PRECEDENCE["compare"]
        text = f"{to_text(node.left, own + 1)} {node.op} {to_text(node.right, own + 1)}"
    elif isinstance(node, Logical):
        own = _PRECEDENCE[node.op]
        text = f" {node.op} ".join(to_text(o, own + 1) for o in node.operands)
    elif isinstance(node, Not):
        own = _PRECEDENCE["not"]
        text = "not " + to_text(node.operand, own)
    else:  # pragma: no cover - every node type is handled above
        raise TypeError(f"not an expression node: {node!r}")
    return f"({text})" if own < parent else text


def shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
