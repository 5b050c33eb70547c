"""The base every component derives from: a frozen pydantic model with a ``kind`` tag.

``extra="forbid"`` turns a misspelt YAML field into an error instead of a silently ignored key;
``strict`` refuses ``true`` for a number and ``"0.2"`` for a float instead of coercing them;
``frozen`` makes a compiled objective immune to later edits of its config. A NaN is refused in
every field (no comparison with it means anything); ``.inf`` passes only where a field's bounds
admit it, as a cap that never binds.
"""

from __future__ import annotations

from typing import Any, ClassVar

import math

import torch
from pydantic import BaseModel, ConfigDict, field_validator


class Component(BaseModel):
    """A declarative piece of an objective.

    Subclasses set ``kind`` (the YAML tag), ``reads`` (the [`TokenBatch`][rlstab.TokenBatch] fields they
    need beyond logprobs and response_mask) and implement their family's methods.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    reads: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="after")
    @classmethod
    def _not_nan(cls, value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("NaN is not a value (write a number)")
        return value

    def describe(self) -> str:
        """One line: what this component computes, with every parameter."""
        raise NotImplementedError


class StepHook:
    """Optional step-level behaviour of a reweighter or surrogate (STARE's gate, BAPO's bounds).

    Once per step the compiled objective sums ``step_sums`` over every micro-batch and rank, then
    calls ``begin_step`` with the totals and the component's state (which it keeps, and saves in
    ``state_dict()``); the returned step value is handed to the component on every micro-batch.
    Components without step-level behaviour inherit these no-ops.
    """

    def step_sums(self, t) -> torch.Tensor | None:
        """A 1-D float64 tensor of sums over this micro-batch's tokens, or None (no step statistics)."""
        return None

    def initial_state(self) -> dict[str, Any] | None:
        """The state before the first step (plain floats/ints, so it survives a checkpoint), or None."""
        return None

    def begin_step(self, sums: torch.Tensor | None, state: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
        """``(step_value, new_state)`` from the step's totals; called once per step."""
        return None, state

    def step_metrics(self, step_value: Any) -> dict[str, float]:
        """Metrics of the step value (e.g. whether a gate is open), without the component prefix."""
        return {}
