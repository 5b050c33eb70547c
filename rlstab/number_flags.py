"""Numeric command-line flags, checked like YAML fields: one pydantic definition for flags and files.

A number flag of ``rlstab demo``, ``audit`` or ``compare`` names the pydantic field it sets: a field
of the trainer's ``TrainConfig`` (which a lab regime file sets too) or of the command's own numbers
(``--threads``, ``--workers``, ...). argparse converts each flag's text with that field (finite,
within its range, an integer where the field is one) and keeps a text the field refuses as it was
typed; :func:`check_numbers` then prints one line per bad flag, naming the flag, the text and what
is allowed, before the command does any work. The range is also in the flag's ``--help``. A
negative number in any notation (``--lr -1e-3``, ``-inf``) reaches the check as a value:
``rlstab.flag_parser`` tells argparse it is not a flag.

Imports pydantic only: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from pydantic import BaseModel, Field, ValidationError, create_model

from rlstab.errors import one_line
from rlstab.trainer.config import MAX_STEPS

_NUMBERS = "_number_flags"
"""The parser default that lists a command's number flags: ``{dest: (model, field)}``."""


class CommandNumbers(BaseModel):
    """The commands' own numbers, beside the trainer's ``TrainConfig``."""

    threads: int = Field(1, ge=1, le=1024)
    """torch CPU threads (``demo``, ``audit``)."""
    workers: int = Field(1, ge=1, le=1024)
    """Local worker processes (``compare``)."""
    checkpoint_every: int = Field(10, ge=1, le=MAX_STEPS)
    """Steps between a run's checkpoints (``compare``)."""
    prompts: int = Field(256, ge=1, le=65_536)
    """Problems sampled (``audit``)."""
    top_k: int = Field(8, ge=1, le=1000)
    """Most silenced tokens shown per mask (``audit``)."""


def number(parser: argparse.ArgumentParser, flag: str, model: type[BaseModel], *, help: str,
           field: str | None = None, default=None, optional: str | None = None) -> None:
    """Add ``flag`` (``--group-size``), set by ``model``'s field (``group_size`` unless ``field``) and checked by it.

    ``help`` ends with its range, read from the field. ``optional``: what leaving the flag out means, for
    a flag whose default is None (``--warmup-steps``).
    """
    dest = flag.lstrip("-").replace("-", "_")
    info = model.model_fields[field or dest]
    range_text = allowed(model, field or dest)
    default_text = optional if default is None else f"default {default:g}" if isinstance(default, float) else f"default {default}"
    parser.add_argument(flag, default=default, type=_Field(model, field or dest),
                        metavar="N" if _integer(info.annotation) else "X",
                        help=f"{help} ({range_text}; {default_text})".replace("%", "%%"))
    numbers = dict(parser.get_default(_NUMBERS) or {})
    numbers[dest] = (model, field or dest)
    parser.set_defaults(**{_NUMBERS: numbers})


class Refused(str):
    """A flag's text that its field refuses: argparse keeps it, :func:`check_numbers` reports it."""


class _Field:
    """The argparse type of a number flag: the field's value, or the text as :class:`Refused` (never an argparse error,
    which would stop at the first bad flag and name this function)."""

    def __init__(self, model: type[BaseModel], field: str):
        self.model, self.field = model, field

    def __call__(self, text: str):
        info = self.model.model_fields[self.field]
        one = create_model("NumberFlag", value=(info.annotation, info))
        try:
            return one.model_validate({"value": text}).value
        except ValidationError:
            return Refused(text)


def allowed(model: type[BaseModel], field: str) -> str:
    """What the field accepts, in words: ``an integer from 2 to 256``, ``a finite number above 0, at most 10``."""
    info = model.model_fields[field]
    bounds = {type(m).__name__: m for m in info.metadata}
    kind = "an integer" if _integer(info.annotation) else "a finite number"
    low = ("ge", "at least") if "Ge" in bounds else ("gt", "above") if "Gt" in bounds else None
    high = ("le", "at most") if "Le" in bounds else ("lt", "below") if "Lt" in bounds else None
    value = {name: getattr(bounds[name.capitalize()], name) for name, _ in filter(None, (low, high))}
    if low and high and low[0] == "ge" and high[0] == "le" and _integer(info.annotation):
        return f"{kind} from {_number(value['ge'])} to {_number(value['le'])}"
    words = [f"{word} {_number(value[name])}" for name, word in filter(None, (low, high))]
    return ", ".join([kind + (" " + words[0] if words else ""), *words[1:]])


def check_numbers(args: argparse.Namespace, command: str) -> bool:
    """Whether every number flag of ``args`` is within its field; prints one line on stderr for each that is not,
    ``COMMAND: --FLAG TEXT: must be WHAT IS ALLOWED``, in the order of the command's flags."""
    flags = getattr(args, _NUMBERS, None) or {}
    bad = [dest for dest in flags if isinstance(getattr(args, dest), Refused)]
    for dest in bad:
        flag = "--" + dest.replace("_", "-")
        print(one_line(f"{command}: {flag} {shlex.quote(getattr(args, dest))}: must be {allowed(*flags[dest])}"),
              file=sys.stderr)
    return not bad


def _integer(annotation) -> bool:
    return annotation is int or (getattr(annotation, "__args__", None) or ())[:1] == (int,)


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"
