"""What every reweighter provides: a positive factor on each token's policy loss.

A reweighter changes how much a token counts without silencing it: the low-probability
reweighting of arXiv 2505.12929 scales advantages by a function of p_old, STARE raises the weight
of high-surprisal tokens, TIS multiplies by a truncated importance ratio. Because every surrogate
is linear in a positive scale of A (the clip branch depends only on the sign of A), scaling the
advantage and scaling the token loss are the same thing; rlstab does the latter, so reweighters
compose with any surrogate and with the trainer's own ``is_weights``. Factors are constants: no
gradient flows through them.
"""

from __future__ import annotations

from typing import Any

from rlstab.components import Component, StepHook
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class Reweighter(StepHook, Component):
    """Base class of reweighters (``reweighters:`` in an objective); factors of an objective multiply."""

    def weights(self, t: Tokens, step: Any) -> torch.Tensor | None:
        """Float32 factors broadcastable to ``[B, T]`` (``[B, 1]`` for per-response factors).
        On padding any finite value (compute from padding's inputs with ``torch.where``).
        None: every factor is 1 in this step (the loss then multiplies nothing)."""
        raise NotImplementedError
