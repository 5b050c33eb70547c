r"""Lopti: low-probability token isolation, one phase of its two updates per step.

The mask keeps the tokens of one phase; a trainer runs the two phases of a step, each a complete
update, with the objectives that [`lopti_phases`][rlstab.compiler.lopti_phases.lopti_phases] makes
(the compiler's side: it reads the whole objective, which a mask does not).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.masks.base import Mask, at_least, below
from rlstab.tokens import Tokens


class Lopti(Mask):
    r"""One phase of Lopti: train only the tokens on one side of $\eta$ in old-policy probability.

    $$\texttt{phase: low}:\ \text{keep iff } \pi_{old}(y_t) < \eta \qquad
      \texttt{phase: high}:\ \text{keep iff } \pi_{old}(y_t) \ge \eta$$

    Low-Probability Token Isolation ("Do Not Let Low-Probability Tokens Over-Dominate in RL for
    LLMs", arXiv 2505.12929; the authors' code github zhyang2226/AR-Lopti, ``ray_trainer.py``,
    ``seperate_updating``): each step runs two full updates, first on the low-probability tokens,
    then on the rest with the policy the first update produced, so that the large gradients of
    low-probability tokens no longer drown the high-probability ones. Default $\eta = 0.5$ (the
    paper's and the authors' scripts' ``SEPERATE_PROB=0.5``). A mask cannot run two updates; a
    trainer runs the two phases (see [`lopti_phases`][rlstab.compiler.lopti_phases.lopti_phases] and
    its module docs).

    Denominators: the authors zero the other phase's advantages and keep veRL's response mask, so
    each phase's token-mean divides by *all* valid tokens: use ``count: valid`` (the ``lopti``
    preset does). Their KL and entropy terms are restricted to the phase's tokens; rlstab's
    regularisers apply to every valid token, so a KL regulariser would count twice per step.
    The authors' alternative split by a probability quantile (``seperate_portion``) is not offered.
    """

    kind: Literal["lopti"] = "lopti"
    eta: float = Field(0.5, gt=0.0, lt=1.0)
    """The probability that splits the tokens."""
    phase: Literal["low", "high"] = "low"
    """``low``: tokens with p_old < eta (the first update); ``high``: the rest (the second)."""

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        side = below if self.phase == "low" else at_least
        return side(t.old_logprobs, math.log(self.eta))

    def describe(self) -> str:
        rule = f"p_old < {self.eta:g}" if self.phase == "low" else f"p_old >= {self.eta:g}"
        order = "first" if self.phase == "low" else "second"
        return f"lopti ({self.phase}): keep iff {rule} (the {order} of two updates per step)"
