"""The ``rlstab`` command's argument parser: argparse, made to answer every mistake in one line.

What :class:`FlagParser` changes, for the ``rlstab`` parser and every subcommand's (argparse makes a
subcommand's parser of its parent's class):

- An error is one line, ``PROG: MESSAGE (see PROG --help for usage)``, exit status 2, where argparse
  prints its usage block first.
- A single-value option given twice is refused: argparse would keep the last one silently
  (``validate --trainer verl --trainer trl`` checked only TRL). The check is argparse's ``store``
  action itself (the default), so a flag is covered as soon as it is added; the flags meant to
  repeat (``--objective``) append, and a switch (``--quiet``) given twice still means on.
- An empty text is refused for a text argument (no ``type``): ``--baseline ""`` would otherwise mean
  "not given". A number flag's empty text is reported by ``rlstab.number_flags``, with its range.
- A negative number in any notation is a value, not a flag: ``--lr -1e-3``, ``--lr -.5`` and
  ``--lr -inf`` reach the number check, where argparse knows only ``-1`` and ``-0.5`` and answers
  "expected one argument".

Imports nothing heavy: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import re
import shlex

from rlstab.errors import one_line

NEGATIVE_NUMBER = re.compile(r"^-(?:(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|inf|infinity|nan)$", re.IGNORECASE)
"""A command-line word that is a negative number (``-1``, ``-.5``, ``-1e-3``, ``-inf``), hence a value, not a flag."""

_GIVEN = "_given_options"
"""The namespace entry in which :class:`_StoreOnce` records the options given so far: ``{dest: value}``."""


class FlagParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with one-line errors, repeated options refused, empty texts refused and
    negative numbers in scientific notation read as values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.register("action", "append", _AppendText)
        self._negative_number_matcher = NEGATIVE_NUMBER  # read by argparse's _parse_optional

    def error(self, message: str):
        self.exit(2, one_line(f"{self.prog}: {message} (see {self.prog} --help for usage)") + "\n")


def _empty(action: argparse.Action, values) -> str | None:
    """Why ``values`` are refused when a text argument (no ``type``) is empty or blank, else None."""
    texts = values if isinstance(values, list) else [values]
    if action.type is not None or not any(isinstance(text, str) and not text.strip() for text in texts):
        return None
    return "empty; give a value" + (" or leave the flag out" if action.option_strings and not action.required else "")


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store``, refusing a second occurrence of the option and an empty text."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.option_strings:
            given = vars(namespace).setdefault(_GIVEN, {})
            if self.dest in given:
                raise argparse.ArgumentError(
                    self, f"given twice ({_shown(given[self.dest])}, then {_shown(values)}): give it once")
            given[self.dest] = values
        problem = _empty(self, values)
        if problem:
            raise argparse.ArgumentError(self, problem)
        super().__call__(parser, namespace, values, option_string)


class _AppendText(argparse._AppendAction):
    """argparse's ``append``, refusing an empty text."""

    def __call__(self, parser, namespace, values, option_string=None):
        problem = _empty(self, values)
        if problem:
            raise argparse.ArgumentError(self, problem)
        super().__call__(parser, namespace, values, option_string)


def _shown(value) -> str:
    return shlex.quote(value) if isinstance(value, str) else repr(value)
