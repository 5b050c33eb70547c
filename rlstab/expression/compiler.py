"""A checked syntax tree -> a tree of closures over torch ops, and the step quantiles it needs.

Conditions are float32 0/1 tensors (as rlstab's masks are): a comparison writes a float output,
``and`` multiplies, ``or`` takes the maximum, ``not`` is ``1 - x``, the last three in place.
Arithmetic follows IEEE float32: a division by zero gives inf, ``log`` of a negative number nan.
Every comparison with nan is false, ``!=`` included: IEEE makes ``nan != c`` true, but here
``x != c`` means ``x < c or x > c`` (two comparisons added into one output), so that ``!=`` obeys
the same rule as the others and ``not (x == c)`` is the only way to select a nan.

A comparison of a probability feature with a positive constant runs in log space
(``probability < 0.002`` is ``logprob < log(0.002)``), which is exactly how the S2T component
compares, so both give the same mask at the boundary too.

``quantile(...)`` calls become step thresholds: the compiled objective gathers each one over every
valid token of the step (all micro-batches, all ranks) and hands them back to ``evaluate``.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from rlstab.expression.features import FEATURES
from rlstab.expression.nodes import Arithmetic, Call, Compare, Feature, Logical, Negate, Node, Not, Number
from rlstab.expression.printer import to_text
from rlstab.lazy import torch
from rlstab.tokens import Tokens

Value: TypeAlias = "torch.Tensor | float"
Compiled = Callable[["Environment"], Value]


def _not_equal(left: torch.Tensor, right: Value, out: torch.Tensor) -> torch.Tensor:
    """``left < right or left > right``: false where either side is nan (``torch.ne`` would say true)."""
    torch.lt(left, right, out=out)
    return out.add_(torch.gt(left, right))  # never both: 0/1


class _TorchFunctions(dict):
    """Name -> torch function, each looked up at its first use: checking an expression imports no torch."""

    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = names

    def __missing__(self, key: str) -> Callable:
        fn = self[key] = getattr(torch, self.names[key])
        return fn


_COMPARE = _TorchFunctions({"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq"})
_COMPARE["!="] = _not_equal
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_UNARY = _TorchFunctions({"abs": "abs", "log": "log", "exp": "exp"})


class Environment:
    """What one evaluation reads: the micro-batch's tokens (features computed once) and the step thresholds."""

    def __init__(self, t: Tokens, thresholds: tuple[torch.Tensor, ...] = ()):
        self.t = t
        self.thresholds = thresholds
        self._features: dict[str, torch.Tensor] = {}

    def feature(self, name: str) -> torch.Tensor:
        value = self._features.get(name)
        if value is None:
            value = self._features[name] = FEATURES[name].compute(self.t)
        return value


@dataclass(frozen=True)
class QuantileSpec:
    """One step quantile: ``text`` as written canonically, ``metric`` its metric name."""

    text: str
    metric: str
    q: float
    values: Compiled
    where: Compiled | None


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shapes' broadcast (``torch.broadcast_shapes`` costs a heavy import on first use)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def _compare(op: str, left: Value, right: Value) -> Value:
    """A float32 0/1 comparison (a float output is several times cheaper than bool-then-float)."""
    if not isinstance(left, torch.Tensor):
        op, left, right = _MIRROR[op], right, left
    shape = _broadcast_shape(left.shape, right.shape) if isinstance(right, torch.Tensor) else left.shape
    return _COMPARE[op](left, right, out=torch.empty(shape, dtype=torch.float32, device=left.device))


# Conditions are always fresh tensors (a comparison's output, or one of these), never a feature, so
# they may be overwritten: in place, ``and``/``or``/``not`` allocate nothing, as the S2T component.


def _and(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.mul_(b) if _broadcast_shape(a.shape, b.shape) == a.shape else torch.mul(a, b)


def _or(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.maximum(a, b, out=a) if _broadcast_shape(a.shape, b.shape) == a.shape else torch.maximum(a, b)


def _minimum(a: Value, b: Value) -> Value:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.minimum(a, b)
    if isinstance(a, torch.Tensor):
        return torch.clamp(a, max=b)
    if isinstance(b, torch.Tensor):
        return torch.clamp(b, max=a)
    return min(a, b)


def _maximum(a: Value, b: Value) -> Value:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.maximum(a, b)
    if isinstance(a, torch.Tensor):
        return torch.clamp(a, min=b)
    if isinstance(b, torch.Tensor):
        return torch.clamp(b, min=a)
    return max(a, b)


class Compiler:
    def __init__(self):
        self.quantiles: list[QuantileSpec] = []
        self.features: set[str] = set()

    def compile(self, node: Node) -> Compiled:
        if isinstance(node, Number):
            value = node.value
            return lambda env: value
        if isinstance(node, Feature):
            name = node.name
            self.features.add(name)
            return lambda env: env.feature(name)
        if isinstance(node, Negate):
            operand = self.compile(node.operand)
            return lambda env: -operand(env)
        if isinstance(node, Arithmetic):
            fn, left, right = _ARITHMETIC[node.op], self.compile(node.left), self.compile(node.right)
            return lambda env: fn(left(env), right(env))
        if isinstance(node, Compare):
            return self.comparison(node)
        if isinstance(node, Logical):
            operands = [self.compile(o) for o in node.operands]
            combine = _and if node.op == "and" else _or

            def logical(env):
                values = [operand(env) for operand in operands]
                values.sort(key=lambda v: v.numel(), reverse=True)  # accumulate into the largest
                result = values[0]
                for value in values[1:]:
                    result = combine(result, value)
                return result

            return logical
        if isinstance(node, Not):
            operand = self.compile(node.operand)
            return lambda env: operand(env).neg_().add_(1.0)
        if isinstance(node, Call):
            return self.call(node)
        raise TypeError(f"not a checked expression node: {node!r}")  # pragma: no cover

    def comparison(self, node: Compare) -> Compiled:
        op, left, right = node.op, node.left, node.right
        if isinstance(left, Number):  # keep the feature on the left: 0.002 > p is p < 0.002
            op, left, right = _MIRROR[op], right, left
        spec = FEATURES.get(left.name) if isinstance(left, Feature) else None
        if spec and spec.log_space and isinstance(right, Number) and right.value > 0 and op not in ("==", "!="):
            left, right = Feature(left.offset, spec.log_space), Number(right.offset, math.log(right.value))
        lhs, rhs = self.compile(left), self.compile(right)
        return lambda env: _compare(op, lhs(env), rhs(env))

    def call(self, node: Call) -> Compiled:
        if node.name == "quantile":
            return self.quantile(node)
        args = [self.compile(a) for a in node.args]
        if node.name in _UNARY.names:
            name, (arg,) = node.name, args
            return lambda env: _UNARY[name](arg(env))
        pair = _minimum if node.name == "min" else _maximum

        def extremum(env):
            result = args[0](env)
            for arg in args[1:]:
                result = pair(result, arg(env))
            return result

        return extremum

    def quantile(self, node: Call) -> Compiled:
        text = to_text(node)
        index = next((i for i, s in enumerate(self.quantiles) if s.text == text), None)
        if index is None:
            index = len(self.quantiles)
            values = self.compile(node.args[0])
            where = self.compile(node.args[2]) if len(node.args) == 3 else None
            metric = _metric_name(text, {s.metric for s in self.quantiles})
            self.quantiles.append(QuantileSpec(text, metric, node.args[1].value, values, where))
        return lambda env: env.thresholds[index]


def _metric_name(text: str, taken: set[str]) -> str:
    """``quantile(entropy, 0.8)`` -> ``quantile_entropy_0.8``: only letters, digits, ``_`` and ``.``."""
    base = re.sub(r"[^A-Za-z0-9_.]+", "_", text).strip("_")
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name
