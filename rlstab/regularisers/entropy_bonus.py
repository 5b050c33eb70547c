"""Entropy bonus."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.regularisers.base import Regulariser


class EntropyBonus(Regulariser):
    r"""Reward exploration: the loss adds $-c \cdot \mathrm{Agg}(H)$.

    The classic PPO entropy bonus (arXiv 1707.06347, eq. 9), veRL's ``entropy_coeff``. The
    entropy must carry its gradient (the trainer computes it from the logits with grad); a
    detached entropy would make the bonus a constant, which is refused with an error.
    Default ``coef = 0.001``; JustRL and most reasoning recipes use none.
    """

    kind: Literal["entropy_bonus"] = "entropy_bonus"
    coef: float = Field(0.001, ge=0.0, le=1.0)
    """Bonus coefficient c."""

    reads: ClassVar[frozenset[str]] = frozenset({"entropy"})

    def term(self, batch, t):
        entropy = batch.entropy
        if batch.logprobs.requires_grad and not entropy.requires_grad:
            raise ValueError(
                "entropy_bonus needs TokenBatch.entropy with gradient (computed from the logits with grad); "
                "it was detached, so the bonus would do nothing"
            )
        return -entropy.to(torch.float32)

    def describe(self) -> str:
        return f"entropy_bonus: + {self.coef:g} * Agg(-H){self._on_tokens()}"
