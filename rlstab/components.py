"""The base every component derives from: a frozen pydantic model with a ``kind`` tag.

``extra="forbid"`` turns a misspelt YAML field into an error instead of a silently ignored key;
``strict`` refuses ``true`` for a number and ``"0.2"`` for a float instead of coercing them;
``frozen`` makes a compiled objective immune to later edits of its config.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Component(BaseModel):
    """A declarative piece of an objective.

    Subclasses set ``kind`` (the YAML tag), ``reads`` (the [`TokenBatch`][rlstab.TokenBatch] fields they
    need beyond logprobs and response_mask) and implement their family's methods.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    reads: ClassVar[frozenset[str]] = frozenset()

    def describe(self) -> str:
        """One line: what this component computes, with every parameter."""
        raise NotImplementedError
