"""DAPO's overlong reward shaping: a soft length penalty in the last L_buf tokens of the budget."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rlstab.lazy import torch
from rlstab.step.base import RewardShaping


def overlong_penalty(
    lengths: torch.Tensor, max_length: int = 20480, buffer: int = 4096, penalty_factor: float = 1.0
) -> torch.Tensor:
    """``[B]`` float32 ``min(-(|y| - (L_max - L_buf)) / L_buf * factor, 0)``; add it to the rewards."""
    exceed = lengths.to(torch.float32) - float(max_length - buffer)
    return (exceed.neg() / buffer * penalty_factor).clamp(max=0.0)


class OverlongPenalty(RewardShaping):
    r"""DAPO's soft overlong punishment, added to each response's reward before the advantage estimator.

    $$R_i \leftarrow R_i + \min\!\Bigl(-\frac{|y_i| - (L_{max} - L_{buf})}{L_{buf}}\,c,\ 0\Bigr)$$

    DAPO (arXiv 2503.14476, eq. 13): no penalty up to $L_{max} - L_{buf}$ tokens, then a penalty
    growing linearly to $-c$ at $L_{max}$. Defaults ``max_length = 20480``, ``buffer = 4096``
    (DAPO's 16,384 expected + 4,096 buffer), ``penalty_factor c = 1`` (veRL's
    ``overlong_buffer.penalty_factor``). As veRL's DAPO reward manager, the penalty is not floored
    at $-c$: the paper's $-1$ branch for $|y| > L_{max}$ never applies when generation stops at
    $L_{max}$. $|y_i|$ is the number of response tokens (``response_mask``, EOS included, as
    veRL's ``valid_response_length``).

    In an objective (``reward_shaping:``) it shapes ``TokenBatch.rewards`` when the objective
    estimates advantages; a batch that carries advantages is refused (the shaping would be
    silently lost): shape the rewards in the trainer with
    [`overlong_penalty`][rlstab.step.overlong_penalty] instead.
    """

    kind: Literal["overlong"] = "overlong"
    max_length: int = Field(20480, ge=1)
    """L_max: the generation budget in tokens."""
    buffer: int = Field(4096, ge=1)
    """L_buf: the penalty ramps over the last L_buf tokens of the budget."""
    penalty_factor: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """c: the penalty at L_max."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards"})

    @model_validator(mode="after")
    def _buffer_inside_budget(self):
        if self.buffer > self.max_length:
            raise ValueError(f"buffer ({self.buffer}) must not exceed max_length ({self.max_length})")
        return self

    def penalty(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[B]`` penalties of responses with ``lengths`` tokens."""
        return overlong_penalty(lengths, self.max_length, self.buffer, self.penalty_factor)

    def describe(self) -> str:
        start = self.max_length - self.buffer
        return (
            f"overlong: R += min(-(|y| - {start}) / {self.buffer} * {self.penalty_factor:g}, 0) "
            f"(no penalty up to {start} tokens, -{self.penalty_factor:g} at {self.max_length})"
        )
