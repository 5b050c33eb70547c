"""The syntax tree of an expression: immutable nodes, each knowing where it starts and how deep it is.

``offset`` is the 0-based position of the node's own token (the operator of a binary node, the
name of a call); ``start`` that of its leftmost token, where errors about the node point.
``depth`` (a leaf is 1) is fixed when the node is built, so the parser can refuse a tree that is
too deep without ever recursing over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Node:
    offset: int

    def children(self) -> tuple[Node, ...]:
        return ()

    @property
    def start(self) -> int:
        return self.offset

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", 1 + max((c.depth for c in self.children()), default=0))


@dataclass(frozen=True)
class Number(Node):
    """A numeric constant (a literal, or constants folded by the checker)."""

    value: float
    depth: int = field(init=False, compare=False, repr=False)


@dataclass(frozen=True)
class Boolean(Node):
    """A constant condition (only ever produced by the checker's folding)."""

    value: bool
    depth: int = field(init=False, compare=False, repr=False)


@dataclass(frozen=True)
class Feature(Node):
    """A per-token feature such as ``entropy``."""

    name: str
    depth: int = field(init=False, compare=False, repr=False)


@dataclass(frozen=True)
class Negate(Node):
    """Unary minus."""

    operand: Node
    depth: int = field(init=False, compare=False, repr=False)

    def children(self):
        return (self.operand,)


@dataclass(frozen=True)
class Arithmetic(Node):
    """``left op right`` with op one of ``+ - * /``."""

    op: str
    left: Node
    right: Node
    depth: int = field(init=False, compare=False, repr=False)

    def children(self):
        return (self.left, self.right)

    @property
    def start(self) -> int:
        return self.left.start


@dataclass(frozen=True)
class Compare(Node):
    """``left op right`` with op one of ``< <= > >= == !=``."""

    op: str
    left: Node
    right: Node
    depth: int = field(init=False, compare=False, repr=False)

    def children(self):
        return (self.left, self.right)

    @property
    def start(self) -> int:
        return self.left.start


@dataclass(frozen=True)
class Logical(Node):
    """``a and b and ...`` or ``a or b or ...`` (flattened: a chain is one node)."""

    op: str
    operands: tuple[Node, ...]
    depth: int = field(init=False, compare=False, repr=False)

    def children(self):
        return self.operands

    @property
    def start(self) -> int:
        return self.operands[0].start


@dataclass(frozen=True)
class Not(Node):
    operand: Node
    depth: int = field(init=False, compare=False, repr=False)

    def children(self):
        return (self.operand,)


@dataclass(frozen=True)
class Call(Node):
    """``name(args...)``; the parser only builds calls of whitelisted functions."""

    name: str
    args: tuple[Node, ...]
    depth: int = field(init=False, compare=False, repr=False)

    def children(self):
        return self.args
