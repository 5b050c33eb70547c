"""Aggregations (``aggregation:``): how per-token losses become one number.

Always explicit, because the denominator is part of the method: a mask that silences 80% of
tokens changes a kept-token mean five-fold against a valid-token mean.

Every aggregation is a weighted sum ``sum_t scale_t * kept_t * l_t`` with a detached per-token
``scale``. Its denominators are counted over the whole step (every micro-batch and every rank),
then multiplied by the data-parallel world size because DDP and FSDP *average* gradients over
ranks. Summing the micro-batch losses of a step and averaging over ranks therefore gives exactly
the loss of the whole step computed at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from rlstab.components import Component
from rlstab.lazy import torch

Count = Literal["kept", "valid"]


@dataclass(frozen=True)
class StepCounts:
    """Denominators of a step, summed over micro-batches and ranks."""

    tokens_valid: float
    tokens_kept: float
    sequences_valid: float
    sequences_kept: float
    max_length: int
    world_size: int

    def tokens(self, count: Count) -> float:
        return self.tokens_kept if count == "kept" else self.tokens_valid

    def sequences(self, count: Count) -> float:
        return self.sequences_kept if count == "kept" else self.sequences_valid


class Aggregation(Component):
    """Base class of aggregations."""

    count: Count
    """Which tokens the denominators count: ``kept`` (after the masks) or every ``valid`` token. Required."""

    # Whether ``scale`` reads ``row_tokens`` (True unless a built-in aggregation says otherwise): the loss passes
    # None to one that does not, and sums no row for it.
    _reads_row_tokens: ClassVar[bool] = True

    def scale(self, step: StepCounts, row_tokens: torch.Tensor | None) -> torch.Tensor | float:
        """Per-token weight, broadcastable to ``[B, T]``. ``row_tokens``: ``[B]`` counted tokens per response
        (None for a built-in aggregation that does not read it)."""
        raise NotImplementedError


class TokenMean(Aggregation):
    r"""$\frac{1}{N}\sum_{i,t} l_{i,t}$ with N the step's number of kept (``count: kept``) or valid tokens.

    veRL's and DAPO's ``token-mean``: every token weighs the same, so long responses are not
    down-weighted. STAPO divides by kept tokens; 20-Entropy and TRL by all valid tokens.
    """

    kind: Literal["token-mean"] = "token-mean"
    _reads_row_tokens: ClassVar[bool] = False

    def scale(self, step, row_tokens):
        return step.world_size / max(step.tokens(self.count), 1.0)

    def describe(self) -> str:
        return f"token-mean: sum over tokens / number of {self.count} tokens in the step"


class TokenSum(Aggregation):
    r"""$\sum_{i,t} l_{i,t}$: no denominator (veRL's ``token-sum``).

    The loss scales with the number of tokens in the step, so the learning rate must absorb the
    batch size. ``count`` is accepted for uniformity and changes nothing.
    """

    kind: Literal["token-sum"] = "token-sum"
    _reads_row_tokens: ClassVar[bool] = False

    def scale(self, step, row_tokens):
        return float(step.world_size)

    def describe(self) -> str:
        return "token-sum: sum over tokens (no denominator)"


class SeqMeanTokenMean(Aggregation):
    r"""$\frac{1}{S}\sum_i \frac{1}{n_i}\sum_t l_{i,t}$: the original GRPO aggregation.

    $n_i$ counts response i's kept or valid tokens; S counts the step's responses that have at
    least one such token. Used by GSPO.
    """

    kind: Literal["seq-mean-token-mean"] = "seq-mean-token-mean"

    def scale(self, step, row_tokens):
        per_row = step.world_size / (row_tokens.clamp(min=1.0) * max(step.sequences(self.count), 1.0))
        return per_row.unsqueeze(-1)

    def describe(self) -> str:
        return f"seq-mean-token-mean: mean over responses of (sum over tokens / number of {self.count} tokens of the response)"


class SeqMeanTokenSum(Aggregation):
    r"""$\frac{1}{S}\sum_i \sum_t l_{i,t}$, S the step's responses with at least one counted token."""

    kind: Literal["seq-mean-token-sum"] = "seq-mean-token-sum"
    _reads_row_tokens: ClassVar[bool] = False

    def scale(self, step, row_tokens):
        return step.world_size / max(step.sequences(self.count), 1.0)

    def describe(self) -> str:
        return f"seq-mean-token-sum: sum over tokens / number of responses with {self.count} tokens in the step"


class SeqMeanTokenSumNorm(Aggregation):
    r"""$\frac{1}{S\,L}\sum_i \sum_t l_{i,t}$ with a constant L (Dr.GRPO, arXiv 2503.20783).

    Dr.GRPO replaces each response's length by a constant so that the gradient does not favour
    short correct answers and long wrong ones. ``norm``: the constant L (the generation budget),
    or ``max_length``: the padded response length, taken as the maximum over the step's
    micro-batches (veRL's default ``loss_scale_factor``; TRL's ``max_completion_length`` when
    responses are padded to it).
    """

    kind: Literal["seq-mean-token-sum-norm"] = "seq-mean-token-sum-norm"
    _reads_row_tokens: ClassVar[bool] = False
    norm: Annotated[int, Field(ge=1)] | Literal["max_length"] = "max_length"
    """The constant L: a positive integer, or ``max_length`` (the step's padded response length)."""

    def scale(self, step, row_tokens):
        norm = step.max_length if self.norm == "max_length" else self.norm
        return step.world_size / (max(step.sequences(self.count), 1.0) * max(norm, 1))

    def describe(self) -> str:
        norm = "the step's padded response length" if self.norm == "max_length" else str(self.norm)
        return f"seq-mean-token-sum-norm: sum over tokens / (number of responses with {self.count} tokens * {norm})"

