"""The one error of the expression language: what is wrong, and where (a column and a caret)."""

from __future__ import annotations

_WINDOW = 100  # longest excerpt of the expression shown above the caret


class ExpressionError(ValueError):
    """An expression that cannot be parsed, type-checked or compiled.

    ``str(err)`` reads ``unknown name 'entropi' at column 12 (did you mean 'entropy'?)``, then the
    expression and a caret under the column; ``err.line`` is the first line alone (what an
    objective's ConfigError shows, one line per problem). ``column`` is 1-based, counted in characters.
    """

    def __init__(self, problem: str, text: str, offset: int, hint: str = ""):
        self.problem = problem
        self.text = text
        self.column = offset + 1
        self.hint = hint
        super().__init__(self._format(offset))

    @property
    def line(self) -> str:
        """What is wrong and where, on one line: ``unknown name 'entropi' at column 12 (did you mean 'entropy'?)``."""
        return f"{self.problem} at column {self.column}" + (f" ({self.hint})" if self.hint else "")

    def _format(self, offset: int) -> str:
        line = self.line
        # One line, whatever whitespace the YAML put in, so the caret stays under its column.
        shown = "".join(c if c.isprintable() else " " for c in self.text)
        start = 0
        if len(shown) > _WINDOW:
            start = max(0, min(offset - _WINDOW // 2, len(shown) - _WINDOW))
        excerpt = shown[start : start + _WINDOW]
        prefix = "..." if start > 0 else ""
        suffix = "..." if start + _WINDOW < len(shown) else ""
        caret = " " * (len(prefix) + offset - start) + "^"
        return f"{line}\n    {prefix}{excerpt}{suffix}\n    {caret}"
