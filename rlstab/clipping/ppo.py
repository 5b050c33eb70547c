"""The PPO clipped surrogate with asymmetric bounds (clip-higher), dual-clip and two-sided clipping (delta)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, unclamped
from rlstab.clipping.bounded import clip_between
from rlstab.clipping.clip_range import ClipRange
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class PPOClip(ClipRange):
    r"""PPO clip (Schulman et al., arXiv 1707.06347, eq. 7) with clip-higher and dual-clip.

    $$l = \max\bigl(-A r,\; -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\bigr),
    \qquad \text{and for } A < 0:\; l \leftarrow \min(l, -cA)$$

    with $r = \exp(\mathrm{clamp}(\log\pi - \log\pi_{old}, -c_r, c_r))$, $c_r$ the objective's
    ``log_ratio_clamp`` (20, as veRL).

    - Clip-higher (DAPO, arXiv 2503.14476): ``eps_high = 0.28`` > ``eps_low = 0.2`` lets unlikely
      tokens grow faster and keeps entropy from collapsing.
    - Dual-clip (Ye et al., arXiv 1912.09729): for negative advantages the loss is bounded by
      ``-c A``, so a huge ratio on a bad token cannot blow the update up. veRL's default is
      ``c = 3`` (always on); DAPO's scripts use 10; ``null`` turns it off.

    - Two-sided clipping (``delta``; INTELLECT-2, arXiv 2505.07291, section 4.1; TRL 1.16's
      ``GRPOConfig.delta``, ``trl/trainer/grpo_trainer.py`` ``GRPOTrainer._compute_loss``: ``coef_1 =
      torch.clamp(coef_1, max=self.args.delta)`` before the min): the unclipped branch's ratio is
      capped at $\delta$ too,

      $$l = \max\bigl(-A \min(r, \delta),\; -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\bigr),$$

      i.e. for $A > 0$: $l = -A \min(r, 1+\epsilon_{high}, \delta)$, and for $A < 0$:
      $l = -A\,\mathrm{clip}(r, 1-\epsilon_{low}, \max(\delta, 1+\epsilon_{high}))$. With
      $\delta > 1 + \epsilon_{high}$ (TRL's recommendation; INTELLECT-2 trains with
      $\delta = 4$, $\epsilon = 0.2$, section 4.1) this is exactly dual-clip with $c = \delta$; a smaller $\delta$ also lowers the
      upper bound of positive-advantage tokens to $\delta$, as TRL computes. ``delta`` and
      ``dual_clip`` bound the same branch: set one of them.

    Defaults ``eps_low = eps_high = 0.2`` (PPO), ``dual_clip = null``, ``delta = null``.

    Metrics: ``clip/high_fraction`` (A > 0, r > 1 + eps_high), ``clip/low_fraction`` (A < 0,
    r < 1 - eps_low) — the tokens whose gradient the clip removes — and ``clip/dual_fraction``
    (A < 0, r > c, or r > max(delta, 1 + eps_high) with ``delta``), as fractions of valid tokens.
    """

    kind: Literal["ppo_clip"] = "ppo_clip"
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip range: r is clipped below at 1 - eps_low."""
    eps_high: float = Field(0.2, ge=0.0, le=10.0)
    """Upper clip range: r is clipped above at 1 + eps_high."""
    dual_clip: float | None = Field(None, gt=1.0)
    """Dual-clip constant c (> 1) bounding the loss of negative-advantage tokens by -c A; null: off."""
    delta: float | None = Field(None, gt=0.0)
    """Two-sided clipping (TRL's ``delta``): the ratio of the unclipped branch is capped at delta; null: off."""
    _later_fields: ClassVar[tuple[str, ...]] = ("delta",)

    def _delta_cap(self) -> float | None:
        return self.delta

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        # Each token's clip interval: A > 0: r <= 1+eh (min(1+eh, delta)).  A < 0: 1-el <= r <= c (max(1+eh, delta)).
        return clip_between(t, weight, *self.ratio_bounds())

    def describe(self) -> str:
        return f"ppo_clip: {self.clip_text()}"


class NoClip(Surrogate):
    r"""No clipping: the importance-weighted policy gradient $l = -A\,r$.

    On-policy (r = 1) this is REINFORCE with the given advantages. Useful as an ablation and for
    methods that bound the update by masking instead of clipping.
    """

    kind: Literal["none"] = "none"

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        wa = weight * t.advantage_rows
        loss = -torch.dot(wa.reshape(-1), t.ratio.reshape(-1))
        grad = wa.mul_(t.ratio).mul_(unclamped(t)).neg_()
        return SurrogateResult(loss, grad, {})

    def describe(self) -> str:
        return "none: l = -A r (no clipping)"

