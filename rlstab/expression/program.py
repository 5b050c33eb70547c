"""``compile_expression(text)``: parse, check and compile an expression into a [`Program`][rlstab.expression.Program]."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from rlstab.expression.checker import check
from rlstab.expression.compiler import Compiled, Compiler, Environment, QuantileSpec
from rlstab.expression.features import FEATURES
from rlstab.expression.nodes import Node
from rlstab.expression.parser import parse
from rlstab.expression.printer import to_text
from rlstab.lazy import torch
from rlstab.tokens import Tokens


@dataclass(frozen=True)
class Program:
    """A compiled condition over tokens.

    Attributes:
        text: the expression as written.
        canonical: the same expression re-printed (constants folded, minimal parentheses).
        quantiles: the step quantiles it needs, in order (identical calls share one).
        features: the features it reads.
        reads: the [`TokenBatch`][rlstab.TokenBatch] fields those features need (beyond logprobs).
    """

    text: str
    tree: Node = field(repr=False)
    canonical: str
    quantiles: tuple[QuantileSpec, ...] = field(compare=False)  # compiled from the tree, which is compared
    features: frozenset[str]
    reads: frozenset[str]
    _condition: Compiled = field(repr=False, compare=False)

    def quantile_requests(self, t: Tokens) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        """One ``(values, include, q)`` per quantile: its values on this micro-batch's tokens and
        which tokens belong to the population (valid, meeting ``where``, value not nan)."""
        env = Environment(t)
        shape = t.valid_bool.shape
        requests = []
        for spec in self.quantiles:
            values = torch.broadcast_to(_tensor(spec.values(env), t), shape)
            include = t.valid_bool & ~torch.isnan(values)
            if spec.where is not None:
                include = include & (spec.where(env) > 0)
            requests.append((values, include, spec.q))
        return requests

    def evaluate(self, t: Tokens, thresholds: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
        """``[B, T]`` float32, 1.0 where the condition holds, given the step's quantile values."""
        if len(thresholds) != len(self.quantiles):
            raise ValueError(f"{self.canonical!r} needs {len(self.quantiles)} quantile values, got {len(thresholds)}")
        result = _tensor(self._condition(Environment(t, tuple(thresholds))), t)
        return torch.broadcast_to(result, t.valid.shape).contiguous()


def _tensor(value, t: Tokens) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.full((1, 1), float(value), dtype=torch.float32, device=t.valid.device)


@functools.lru_cache(maxsize=256)
def compile_expression(text: str) -> Program:
    """Parse, type-check and compile ``text``; raises [`ExpressionError`][rlstab.expression.ExpressionError].

    Nothing in ``text`` is ever handed to Python: it is tokenized and parsed by rlstab's own
    parser against a closed list of names, and compiled to torch operations.
    """
    tree = check(parse(text), text)
    compiler = Compiler()
    condition = compiler.compile(tree)
    features = frozenset(compiler.features)
    reads = frozenset().union(*(FEATURES[f].reads for f in features))
    return Program(text, tree, to_text(tree), tuple(compiler.quantiles), features, reads, condition)
