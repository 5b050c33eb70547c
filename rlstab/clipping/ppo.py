"""The PPO clipped surrogate with asymmetric bounds (clip-higher), dual-clip and two-sided clipping (delta)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_serializer, model_validator

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
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

    @model_validator(mode="after")
    def _dual_clip_above_clip_range(self):
        if self.dual_clip is not None and self.dual_clip <= 1.0 + self.eps_high:
            raise ValueError(f"dual_clip ({self.dual_clip}) must exceed 1 + eps_high ({1.0 + self.eps_high})")
        if self.dual_clip is not None and self.delta is not None:
            raise ValueError(
                f"dual_clip ({self.dual_clip}) and delta ({self.delta}) both bound the ratio of negative-advantage "
                "tokens; set one (delta > 1 + eps_high is dual_clip = delta)"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_unset_delta(self, handler):
        # delta came later: absent while unset, so an objective keeps its fingerprint (and lab folders resume)
        data = handler(self)
        if self.delta is None and isinstance(data, dict):
            data.pop("delta", None)
        return data

    def _bounds(self) -> tuple[float, float, float]:
        """``(lower, upper for A > 0, upper for A < 0)`` of the ratio's clip interval."""
        upper, lower = 1.0 + self.eps_high, 1.0 - self.eps_low
        if self.delta is not None:
            return lower, min(upper, self.delta), max(upper, self.delta)
        return lower, upper, (math.inf if self.dual_clip is None else self.dual_clip)

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, adv = t.ratio, t.advantage_rows  # adv: [B, 1] (one per response) or [B, T]
        lower, upper, dual = self._bounds()
        # Each token's clip interval: A > 0: r <= 1+eh.  A < 0: 1-el <= r <= c.  (r > 0 always.)
        # One clamp with per-response bounds is the active branch of the max (and of the dual min):
        # A > 0: l = -A min(r, 1+eh).  A < 0: l = -A clamp(r, 1-el, c).  A = 0: l = 0 and its gradient
        # 0 whatever the bounds (the weight -A is a zero).
        # With delta: A > 0: upper = min(1+eh, delta); A < 0: c = max(1+eh, delta) (see the docstring).
        neg = adv < 0
        lo = neg * lower  # 0 where A >= 0: no lower bound there, since r > 0
        hi = torch.where(neg, dual, upper)
        r_clip = torch.clamp(r, min=lo, max=hi)
        w = weight * adv.neg()
        loss = torch.dot(w.view(-1), r_clip.view(-1))
        # d l / d logp = -A r where r is inside its clip interval (r_clip == r), 0 where clipped.
        grad = w.mul_(indicator(torch.eq, r_clip, r)).mul_(r).mul_(unclamped(t))
        return SurrogateResult(loss, grad, _clip_counts(t, r_clip, not math.isinf(dual)))

    def describe(self) -> str:
        s = f"ppo_clip: l = max(-A r, -A clip(r, {1 - self.eps_low:g}, {1 + self.eps_high:g}))"
        if self.dual_clip is not None:
            s += f"; for A < 0, l = min(l, -{self.dual_clip:g} A) (dual-clip)"
        if self.delta is not None:
            s = (f"ppo_clip: l = max(-A min(r, {self.delta:g}), -A clip(r, {1 - self.eps_low:g}, {1 + self.eps_high:g}))"
                 " (two-sided clip, delta)")
        return s


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


def _clip_counts(t: Tokens, r_clip: torch.Tensor, dual: bool) -> dict[str, torch.Tensor]:
    """Valid tokens outside their clip interval, by the sign of A: above it (A > 0: ``clip/high_fraction``;
    A < 0: ``clip/dual_fraction``, beyond the dual clip) or below it (A < 0: ``clip/low_fraction``). Counts of
    0/1 values: exact whichever way they are summed (float32 up to 2**24 tokens)."""
    r, valid = t.ratio, t.valid
    above, below = indicator(torch.gt, r, r_clip), indicator(torch.lt, r, r_clip)
    adv = t.advantage_per_response
    if adv is not None:  # per response: each row's tokens above and below (0/1 products), weighed by the row's sign
        above, below = above.mul_(valid).sum(-1), below.mul_(valid).sum(-1)
    else:  # per token: the valid tokens' indicators, weighed by each token's sign
        adv = t.advantage_rows.reshape(-1)
        above, below = above.mul_(valid).view(-1), below.mul_(valid).view(-1)
    pos, neg = indicator(torch.gt, adv, 0.0), indicator(torch.lt, adv, 0.0)
    counts = {"clip/high_fraction": torch.dot(pos, above), "clip/low_fraction": torch.dot(neg, below)}
    if dual:
        counts["clip/dual_fraction"] = torch.dot(neg, above)
    return counts
