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

    average: Literal["objective", "micro_batch"] = "objective"
    """How the term is averaged. ``objective``: with the objective's aggregation over the step's valid tokens, the
    same whatever the micro-batch split. ``micro_batch``: each micro-batch's mean over its valid tokens, weighted by
    its share of the step's responses, as TRL 1.16 averages its entropy bonus (``entropy_coef``,
    ``use_adaptive_entropy``: the micro-batch's mean entropy / ``gradient_accumulation_steps``); it then depends on
    the split. The share counts responses with a valid token, so it is TRL's exactly unless a micro-batch holds a
    completion without one (TRL's ``mask_truncated_completions``), which TRL's share still counts."""

    _later_fields: ClassVar[tuple[str, ...]] = ("tokens", "average")

    @property
    def added_by_trainers(self) -> bool:
        """Whether this is the term a trainer's own setting adds (an adapter then asks for that setting instead)."""
        return True

    def _on_tokens(self) -> str:
        """What ``describe`` appends for ``tokens: kept`` and ``average: micro_batch``."""
        kept = " on kept tokens" if self.tokens == "kept" else ""
        return kept + (", Agg = each micro-batch's token mean x its share of responses" if self.average == "micro_batch" else "")

    def coefficient(self, step: object = None) -> float:
        """The coefficient this step applies (``step``: the value of ``begin_step``); ``coef`` unless step-level."""
        return self.coef

    def term(self, batch: TokenBatch, t: Tokens) -> torch.Tensor:
        """``[B, T]`` float32 per-token term, with gradient; the loss adds ``coef * Agg(term)``."""
        raise NotImplementedError
