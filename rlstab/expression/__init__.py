"""Expression masks' language: a condition over token features, parsed and compiled by rlstab itself.

    advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8)

[`compile_expression`][rlstab.expression.compile_expression] tokenizes (``lexer``), parses
(``parser``, recursive descent), type-checks and folds constants (``checker``) and compiles to
torch operations (``compiler``). No step uses ``eval``, ``exec``, ``compile`` or Python's ``ast``,
and names resolve only against [`FEATURES`][rlstab.expression.FEATURES] and
[`FUNCTIONS`][rlstab.expression.FUNCTIONS]. See docs/expressions.md for the language.
"""

from rlstab.expression.errors import ExpressionError
from rlstab.expression.features import FEATURES, FUNCTIONS
from rlstab.expression.lexer import MAX_LENGTH
from rlstab.expression.parser import MAX_DEPTH, parse
from rlstab.expression.program import Program, compile_expression

__all__ = ["FEATURES", "FUNCTIONS", "MAX_DEPTH", "MAX_LENGTH", "ExpressionError", "Program", "compile_expression", "parse"]
