"""The PPO clipped surrogate with asymmetric bounds (clip-higher) and dual-clip."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.tokens import Tokens


class PPOClip(Surrogate):
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

    Defaults ``eps_low = eps_high = 0.2`` (PPO), ``dual_clip = null``.

    Metrics: ``clip/high_fraction`` (A > 0, r > 1 + eps_high), ``clip/low_fraction`` (A < 0,
    r < 1 - eps_low) — the tokens whose gradient the clip removes — and ``clip/dual_fraction``
    (A < 0, r > c), as fractions of valid tokens.
    """

    kind: Literal["ppo_clip"] = "ppo_clip"
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip range: r is clipped below at 1 - eps_low."""
    eps_high: float = Field(0.2, ge=0.0, le=10.0)
    """Upper clip range: r is clipped above at 1 + eps_high."""
    dual_clip: float | None = Field(None, gt=1.0)
    """Dual-clip constant c (> 1) bounding the loss of negative-advantage tokens by -c A; null: off."""

    @model_validator(mode="after")
    def _dual_clip_above_clip_range(self):
        if self.dual_clip is not None and self.dual_clip <= 1.0 + self.eps_high:
            raise ValueError(f"dual_clip ({self.dual_clip}) must exceed 1 + eps_high ({1.0 + self.eps_high})")
        return self

    def evaluate(self, t: Tokens, weight: torch.Tensor) -> SurrogateResult:
        r, adv = t.ratio, t.advantages
        upper, lower = 1.0 + self.eps_high, 1.0 - self.eps_low
        a_pos, a_neg = adv.clamp(min=0.0), adv.clamp(max=0.0)
        # A > 0: l = -A min(r, 1+eh).  A < 0: l = -A clamp(r, 1-el, c).  A = 0: l = 0.
        r_pos = r.clamp(max=upper)
        r_neg = r.clamp(min=lower, max=self.dual_clip)
        w_pos, w_neg = weight * a_pos, weight * a_neg
        loss = -(torch.dot(w_pos.view(-1), r_pos.reshape(-1)) + torch.dot(w_neg.view(-1), r_neg.reshape(-1)))
        # d l / d logp = -A r where r is inside the active clip branch, 0 where clipped.
        active_neg = indicator(torch.ge, r, lower)
        if self.dual_clip is not None:
            active_neg.mul_(indicator(torch.le, r, self.dual_clip))
        grad = w_pos.mul_(indicator(torch.le, r, upper)).add_(w_neg.mul_(active_neg))
        grad.mul_(r).mul_(unclamped(t)).neg_()

        pos = indicator(torch.gt, adv, 0.0).mul_(t.valid).view(-1)
        neg = indicator(torch.lt, adv, 0.0).mul_(t.valid).view(-1)
        counts = {
            "clip/high_fraction": torch.dot(pos, indicator(torch.gt, r, upper).view(-1)),
            "clip/low_fraction": torch.dot(neg, indicator(torch.lt, r, lower).view(-1)),
        }
        if self.dual_clip is not None:
            counts["clip/dual_fraction"] = torch.dot(neg, indicator(torch.gt, r, self.dual_clip).view(-1))
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        s = f"ppo_clip: l = max(-A r, -A clip(r, {1 - self.eps_low:g}, {1 + self.eps_high:g}))"
        if self.dual_clip is not None:
            s += f"; for A < 0, l = min(l, -{self.dual_clip:g} A) (dual-clip)"
        return s


class NoClip(Surrogate):
    r"""No clipping: the importance-weighted policy gradient $l = -A\,r$.

    On-policy (r = 1) this is REINFORCE with the given advantages. Useful as an ablation and for
    methods that bound the update by masking instead of clipping.
    """

    kind: Literal["none"] = "none"

    def evaluate(self, t: Tokens, weight: torch.Tensor) -> SurrogateResult:
        wa = weight * t.advantages
        loss = -torch.dot(wa.view(-1), t.ratio.reshape(-1))
        grad = wa.mul_(t.ratio).mul_(unclamped(t)).neg_()
        return SurrogateResult(loss, grad, {})

    def describe(self) -> str:
        return "none: l = -A r (no clipping)"
