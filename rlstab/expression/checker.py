"""Type checking and constant folding, before anything is compiled.

Two types: numbers and conditions. Comparisons take numbers and give a condition; ``and``, ``or``,
``not`` take conditions; arithmetic and functions take numbers (``quantile``'s optional third
argument is a condition). The whole expression must be a condition that depends on some token.

Constants are folded here in float64 (``1 / 500`` becomes ``0.002``), and a folded constant must be
finite and fit in float32: ``1 / 0``, ``log(0)`` and ``exp(1000)`` are errors, not ``inf``.

``quantile(x, q[, where])``: ``x`` a number that depends on the tokens, ``q`` a constant in
[0, 1], ``where`` a condition; neither may contain another ``quantile``.
"""

from __future__ import annotations

import math

from rlstab.expression.errors import ExpressionError
from rlstab.expression.lexer import FLOAT32_MAX
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
from rlstab.expression.printer import shorten, to_text

NUMBER, CONDITION = "number", "condition"

_FOLD_COMPARE = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_FOLD_ARITHMETIC = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}
_FOLD_FUNCTION = {"abs": abs, "log": math.log, "exp": math.exp, "min": min, "max": max}


class Checker:
    def __init__(self, text: str):
        self.text = text

    def error(self, problem: str, node: Node, hint: str = "") -> ExpressionError:
        return ExpressionError(problem, self.text, node.start, hint)

    def check_top(self, node: Node) -> Node:
        checked, kind = self.check(node)
        if kind != CONDITION:
            raise self.error(
                "the expression is a number, not a condition", node, "compare it with something, e.g. 'entropy < 0.5'"
            )
        if isinstance(checked, Boolean):
            raise self.error(
                f"the condition is always {'true' if checked.value else 'false'}: it depends on no token feature", node
            )
        return checked

    def check(self, node: Node, in_quantile: bool = False) -> tuple[Node, str]:
        if isinstance(node, (Number, Feature)):
            return node, NUMBER
        if isinstance(node, Negate):
            operand = self.number(node.operand, "unary '-'", in_quantile)
            if isinstance(operand, Number):
                return Number(node.offset, -operand.value), NUMBER
            return Negate(node.offset, operand), NUMBER
        if isinstance(node, Arithmetic):
            left = self.number(node.left, f"'{node.op}'", in_quantile)
            right = self.number(node.right, f"'{node.op}'", in_quantile)
            if isinstance(left, Number) and isinstance(right, Number):
                if node.op == "/" and right.value == 0.0:
                    raise ExpressionError("division by zero", self.text, node.offset)
                return self.constant(_FOLD_ARITHMETIC[node.op](left.value, right.value), node), NUMBER
            return Arithmetic(node.offset, node.op, left, right), NUMBER
        if isinstance(node, Compare):
            left = self.number(node.left, f"'{node.op}'", in_quantile)
            right = self.number(node.right, f"'{node.op}'", in_quantile)
            if isinstance(left, Number) and isinstance(right, Number):
                return Boolean(node.offset, _FOLD_COMPARE[node.op](left.value, right.value)), CONDITION
            return Compare(node.offset, node.op, left, right), CONDITION
        if isinstance(node, Logical):
            return self.logical(node, in_quantile), CONDITION
        if isinstance(node, Not):
            operand = self.condition(node.operand, "'not'", in_quantile)
            if isinstance(operand, Boolean):
                return Boolean(node.offset, not operand.value), CONDITION
            return Not(node.offset, operand), CONDITION
        if isinstance(node, Call):
            if node.name == "quantile":
                return self.quantile(node, in_quantile), NUMBER
            args = tuple(self.number(a, f"{node.name}()", in_quantile) for a in node.args)
            if all(isinstance(a, Number) for a in args):
                try:
                    value = _FOLD_FUNCTION[node.name](*(a.value for a in args))
                except (ValueError, OverflowError):
                    value = math.nan
                return self.constant(value, node), NUMBER
            return Call(node.offset, node.name, args), NUMBER
        raise TypeError(f"not an expression node: {node!r}")  # pragma: no cover

    def constant(self, value: float, node: Node) -> Number:
        if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
            raise self.error(f"the constant {shorten(to_text(node))} is not a finite float32 number", node)
        return Number(node.start, value)

    def number(self, node: Node, user: str, in_quantile: bool) -> Node:
        checked, kind = self.check(node, in_quantile)
        if kind != NUMBER:
            raise self.error(f"{user} needs a number, but {shorten(to_text(node))!r} is a condition", node)
        return checked

    def condition(self, node: Node, user: str, in_quantile: bool) -> Node:
        checked, kind = self.check(node, in_quantile)
        if kind != CONDITION:
            text = shorten(to_text(node))
            raise self.error(
                f"{user} needs a condition, but {text!r} is a number", node, f"compare it, e.g. '{text} > 0'"
            )
        return checked

    def logical(self, node: Logical, in_quantile: bool) -> Node:
        absorbing = node.op == "or"  # the constant that decides the result: True for or, False for and
        kept = []
        for operand in node.operands:
            checked = self.condition(operand, f"'{node.op}'", in_quantile)
            if isinstance(checked, Boolean):
                if checked.value == absorbing:
                    return Boolean(node.offset, absorbing)
                continue  # the neutral constant: drop it
            kept.append(checked)
        if not kept:
            return Boolean(node.offset, not absorbing)
        if len(kept) == 1:
            return kept[0]
        return Logical(node.offset, node.op, tuple(kept))

    def quantile(self, node: Call, in_quantile: bool) -> Node:
        if in_quantile:
            raise ExpressionError("quantile() cannot be nested inside another quantile()", self.text, node.offset)
        values = self.number(node.args[0], "quantile()", True)
        if isinstance(values, Number):
            raise self.error("quantile() of a constant", node.args[0], "its first argument must depend on the tokens")
        q = self.number(node.args[1], "quantile()", True)
        if not isinstance(q, Number) or not 0.0 <= q.value <= 1.0:
            raise self.error(
                f"quantile()'s q must be a constant between 0 and 1, got {shorten(to_text(node.args[1]))!r}",
                node.args[1],
            )
        args = [values, q]
        if len(node.args) == 3:
            where = self.condition(node.args[2], "quantile()'s third argument (which tokens)", True)
            if isinstance(where, Boolean) and not where.value:
                raise self.error("quantile()'s population condition is always false", node.args[2])
            if not isinstance(where, Boolean):  # an always-true condition is no condition
                args.append(where)
        return Call(node.offset, "quantile", tuple(args))


def check(tree: Node, text: str) -> Node:
    """The folded, type-checked tree of a parsed expression; raises ExpressionError."""
    return Checker(text).check_top(tree)
