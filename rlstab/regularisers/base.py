"""What every regulariser provides: a per-token term, added as ``coef * Agg(term)``.

Regularisers are aggregated like the policy loss but with every *valid* token in the denominator:
masks decide which tokens the policy gradient trains on, not where the policy is kept close to its
reference or kept exploratory. By default the term acts on every valid token too; ``tokens: kept``
restricts it to the tokens every mask keeps (the denominator unchanged). They go through autograd
(they are rarely on, and some need gradients through inputs other than the log-probabilities).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.batch import TokenBatch
from rlstab.components import Component, StepHook
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class Regulariser(StepHook, Component):
    """Base class of regularisers (``regularisers:`` in an objective).

    A regulariser with step-level behaviour (``adaptive_entropy``'s controller) is a
    [`StepHook`][rlstab.components.StepHook] like a stateful reweighter: its step value reaches
    ``coefficient``, which gives the coefficient the step applies.
    """

    coef: float = Field(allow_inf_nan=False, description="Coefficient of the term in the loss (finite).")
    tokens: Literal["valid", "kept"] = "valid"
    """Where the term acts: every valid token, or only the tokens every mask keeps (the denominator counts every
    valid token either way)."""

    _later_fields: ClassVar[tuple[str, ...]] = ("tokens",)

    @property
    def added_by_trainers(self) -> bool:
        """Whether this is the term a trainer's own setting adds (an adapter then asks for that setting instead)."""
        return True

    def _on_tokens(self) -> str:
        """What ``describe`` appends for ``tokens: kept``."""
        return " on kept tokens" if self.tokens == "kept" else ""

    def coefficient(self, step: object = None) -> float:
        """The coefficient this step applies (``step``: the value of ``begin_step``); ``coef`` unless step-level."""
        return self.coef

    def term(self, batch: TokenBatch, t: Tokens) -> torch.Tensor:
        """``[B, T]`` float32 per-token term, with gradient; the loss adds ``coef * Agg(term)``."""
        raise NotImplementedError
