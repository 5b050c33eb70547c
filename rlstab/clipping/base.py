"""What every surrogate provides: the per-token loss and its derivative, in one pass.

The compiled objective needs ``sum_t w_t * l_t`` and its gradient with respect to the current
log-probabilities. Surrogates give the derivative in closed form, so the loss never builds an
autograd graph over a dozen [B, T] intermediates: the backward pass is one multiply. This is
where rlstab's speed comes from; tests check every closed form against autograd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlstab.components import Component, StepHook
from rlstab.lazy import torch
from rlstab.tokens import Tokens


@dataclass
class SurrogateResult:
    """``loss``: 0-d ``sum_t w_t l_t``. ``grad``: ``[B, T]`` ``w_t dl_t/dlogp_t``.
    ``counts``: metric name -> 0-d count over valid tokens (turned into fractions by the caller)."""

    loss: torch.Tensor
    grad: torch.Tensor
    counts: dict[str, torch.Tensor]


class Surrogate(StepHook, Component):
    """Base class of surrogate / ratio rules (``surrogate:`` in an objective)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step: Any = None) -> SurrogateResult:
        """Weighted loss sum, weighted gradient and clip counts for one micro-batch.

        ``step``: the value of ``begin_step`` for surrogates with step-level behaviour (else None).
        """
        raise NotImplementedError


def indicator(op, x: torch.Tensor, bound: float) -> torch.Tensor:
    """Float 0/1 result of ``op(x, bound)``: a float-output compare is several times cheaper than bool."""
    return op(x, bound, out=torch.empty_like(x))


def unclamped(t: Tokens) -> torch.Tensor:
    """1.0 where the log-ratio was not clamped (the clamp has zero gradient outside its range)."""
    return indicator(torch.lt, t.log_ratio.abs(), t.log_ratio_clamp)
