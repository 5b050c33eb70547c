"""Recursive-descent parser: tokens -> syntax tree. No ``eval``, no Python ``ast``, no attribute lookup.

Grammar (lowest precedence first; ``and``/``or``/``not`` as in Python)::

    condition  := conjunct ("or" conjunct)*
    conjunct   := negation ("and" negation)*
    negation   := "not" negation | comparison
    comparison := sum [("<" | "<=" | ">" | ">=" | "==" | "!=") sum]     -- no chains
    sum        := product (("+" | "-") product)*
    product    := unary (("*" | "/") unary)*
    unary      := "-" unary | primary
    primary    := NUMBER | FEATURE | FUNCTION "(" condition ("," condition)* ")" | "(" condition ")"

Names resolve against a closed whitelist (features, functions, ``and or not``); anything else is an
error that suggests the closest allowed name. Nesting (parentheses, calls, unary operators) and
the depth of the tree are bounded by ``MAX_DEPTH``, so no input can exhaust the Python stack.
"""

from __future__ import annotations

import difflib
import keyword

from rlstab.expression.errors import ExpressionError
from rlstab.expression.features import FEATURES, FUNCTIONS, KEYWORDS
from rlstab.expression.lexer import Token, iter_tokens
from rlstab.expression.nodes import Arithmetic, Call, Compare, Feature, Logical, Negate, Node, Not, Number

MAX_DEPTH = 32
"""Deepest nesting of parentheses, calls and operators accepted."""

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")

_PYTHON_ONLY = {
    "lambda": "lambdas are not part of the expression language",
    "if": "conditional expressions are not part of the expression language",
    "else": "conditional expressions are not part of the expression language",
    "for": "comprehensions and loops are not part of the expression language",
    "in": "'in' is not part of the expression language",
    "is": "'is' is not part of the expression language; compare numbers with '=='",
    "import": "imports are not part of the expression language",
    "from": "imports are not part of the expression language",
    "True": "there are no boolean constants; write a comparison",
    "False": "there are no boolean constants; write a comparison",
    "None": "there is no None",
}


class Parser:
    def __init__(self, text: str):
        self.text = text
        self._tokens = iter_tokens(text)
        self._current = next(self._tokens)
        self.nesting = 0

    # ------------------------------------------------------------------ helpers

    def error(self, problem: str, offset: int, hint: str = "") -> ExpressionError:
        return ExpressionError(problem, self.text, offset, hint)

    @property
    def token(self) -> Token:
        return self._current

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.token
        return tok.kind == kind and (text is None or tok.text == text)

    def advance(self) -> Token:
        tok = self._current
        if tok.kind != "end":
            self._current = next(self._tokens)
        return tok

    def node(self, node: Node) -> Node:
        if node.depth > MAX_DEPTH:
            raise self.error(f"expression nested too deeply (more than {MAX_DEPTH} levels)", node.offset)
        return node

    def enter(self, offset: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"expression nested too deeply (more than {MAX_DEPTH} levels)", offset)

    def describe(self, tok: Token) -> str:
        return "the end of the expression" if tok.kind == "end" else repr(tok.text)

    # ------------------------------------------------------------------ grammar

    def parse(self) -> Node:
        tree = self.condition()
        tok = self.token
        if tok.kind != "end":
            self._refuse_python(tok)
            if tok.text == ")":
                raise self.error("unmatched ')'", tok.offset)
            if tok.text == ",":
                raise self.error("',' outside a function call", tok.offset)
            if tok.text in COMPARISONS:
                raise self.error(
                    "chained comparisons are not supported", tok.offset, "write 'a < b and b < c' instead of 'a < b < c'"
                )
            raise self.error(f"unexpected {self.describe(tok)} after a complete expression", tok.offset,
                             "missing 'and' or 'or'?")
        return tree

    def condition(self) -> Node:
        return self._logical("or", self.conjunct)

    def conjunct(self) -> Node:
        return self._logical("and", self.negation)

    def _logical(self, op: str, operand) -> Node:
        first = operand()
        if not self.at("name", op):
            return first
        operands, offset = [first], self.token.offset
        while self.at("name", op):
            self.advance()
            operands.append(operand())
        return self.node(Logical(offset, op, tuple(operands)))

    def negation(self) -> Node:
        if self.at("name", "not"):
            tok = self.advance()
            self.enter(tok.offset)
            operand = self.negation()
            self.nesting -= 1
            return self.node(Not(tok.offset, operand))
        return self.comparison()

    def comparison(self) -> Node:
        left = self.sum()
        if self.at("op") and self.token.text in COMPARISONS:
            op = self.advance()
            right = self.sum()
            return self.node(Compare(op.offset, op.text, left, right))
        return left

    def sum(self) -> Node:
        left = self.product()
        while self.at("op") and self.token.text in ("+", "-"):
            op = self.advance()
            left = self.node(Arithmetic(op.offset, op.text, left, self.product()))
        return left

    def product(self) -> Node:
        left = self.unary()
        while self.at("op") and self.token.text in ("*", "/"):
            op = self.advance()
            left = self.node(Arithmetic(op.offset, op.text, left, self.unary()))
        return left

    def unary(self) -> Node:
        if self.at("op", "-"):
            tok = self.advance()
            self.enter(tok.offset)
            operand = self.unary()
            self.nesting -= 1
            return self.node(Negate(tok.offset, operand))
        return self.primary()

    def primary(self) -> Node:
        tok = self.token
        if tok.kind == "number":
            self.advance()
            return Number(tok.offset, tok.value)
        if tok.kind == "name":
            return self.name()
        if tok.text == "(":
            self.advance()
            self.enter(tok.offset)
            inner = self.condition()
            self.nesting -= 1
            if not self.at("op", ")"):
                raise self._unclosed(tok)
            self.advance()
            return inner
        if tok.kind == "end":
            raise self.error("the expression ends where a value was expected", tok.offset)
        if tok.text == "+":
            raise self.error("unary '+' is not supported", tok.offset, "drop it")
        if tok.text == ")":
            raise self.error("unexpected ')' where a value was expected", tok.offset)
        raise self.error(f"unexpected {tok.text!r} where a value was expected", tok.offset)

    def _refuse_python(self, tok: Token) -> None:
        """``x if c else y``, ``x for x in y``, ``x is y``: name the Python construct, not just the token."""
        if tok.kind == "name" and tok.text in _PYTHON_ONLY:
            raise self.error(f"'{tok.text}' is not allowed", tok.offset, _PYTHON_ONLY[tok.text])

    def _unclosed(self, opening: Token) -> ExpressionError:
        tok = self.token
        self._refuse_python(tok)
        if tok.kind == "end":
            return self.error("'(' is never closed", opening.offset, "add ')'")
        return self.error(f"expected ')' to close the '(' at column {opening.offset + 1}, found {self.describe(tok)}",
                          tok.offset)

    def name(self) -> Node:
        tok = self.advance()
        name, offset = tok.text, tok.offset
        called = self.at("op", "(")
        if name in KEYWORDS:
            raise self.error(f"'{name}' where a value was expected", offset)
        if name.startswith("_"):
            raise self.error(f"names starting with '_' are not allowed ({name!r})", offset)
        if name in _PYTHON_ONLY:
            raise self.error(f"'{name}' is not allowed", offset, _PYTHON_ONLY[name])
        if keyword.iskeyword(name) or keyword.issoftkeyword(name):
            raise self.error(f"'{name}' is not allowed", offset, "Python keywords are not part of the expression language")
        if called:
            if name in FUNCTIONS:
                return self.call(tok)
            if name in FEATURES:
                raise self.error(f"'{name}' is a feature, not a function", offset)
            raise self.error(f"unknown function '{name}'", offset, f"allowed: {', '.join(sorted(FUNCTIONS))}")
        if name in FEATURES:
            return Feature(offset, name)
        if name in FUNCTIONS:
            raise self.error(f"'{name}' is a function", offset, f"call it: {FUNCTIONS[name][2].split(':')[0]}")
        raise self.error(f"unknown name '{name}'", offset, _suggestion(name))

    def call(self, name: Token) -> Node:
        opening = self.advance()  # "("
        self.enter(name.offset)
        args = []
        if self.at("op", ")"):
            raise self.error(f"{name.text}() needs arguments", self.token.offset, FUNCTIONS[name.text][2])
        while True:
            args.append(self.condition())
            if self.at("op", ","):
                self.advance()
                if self.at("op", ")"):
                    raise self.error("expected an argument after ','", self.token.offset)
                continue
            if self.at("op", ")"):
                self.advance()
                break
            raise self._unclosed(opening)
        self.nesting -= 1
        low, high, usage = FUNCTIONS[name.text]
        if len(args) < low or (high is not None and len(args) > high):
            if high is None:
                wanted = f"at least {low}"
            elif low == high:
                wanted = str(low)
            else:
                wanted = f"{low} to {high}"
            raise self.error(
                f"{name.text}() takes {wanted} argument{'s' if wanted != '1' else ''}, got {len(args)}",
                name.offset,
                usage,
            )
        return self.node(Call(name.offset, name.text, tuple(args)))


def _suggestion(name: str) -> str:
    known = list(FEATURES) + list(FUNCTIONS) + list(KEYWORDS)
    lowered = name.lower()
    if lowered in known:
        return f"did you mean '{lowered}'?"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"features: {', '.join(FEATURES)}"


def parse(text: str) -> Node:
    """The syntax tree of ``text``; raises [`ExpressionError`][rlstab.expression.ExpressionError]."""
    return Parser(text).parse()
