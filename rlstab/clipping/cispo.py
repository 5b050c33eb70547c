"""CISPO: REINFORCE weighted by a truncated, detached importance weight."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class CISPO(Surrogate):
    r"""Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, section 3.1).

    PPO's clip drops the gradient of every token whose ratio left the trust region, and in long
    reasoning chains those are often the rare "fork" tokens ("However", "Wait"). CISPO clips
    the importance weight instead and keeps every token's gradient:

    $$l = -\,\mathrm{sg}\bigl[\hat r\bigr]\, A\, \log\pi_\theta(y_t), \qquad
    \hat r = \mathrm{clip}(r,\ w_{min},\ w_{max}), \qquad
    \frac{\partial l}{\partial \log\pi} = -\hat r\, A$$

    $\mathrm{sg}$ is stop-gradient: the weight is a constant, so every token receives the
    REINFORCE gradient scaled by its truncated ratio, whether or not it was truncated. The loss
    *value* is that of the formula above (it contains $\log\pi$), exactly as veRL 0.9.1's
    ``cispo`` and TRL 1.16's ``loss_type="cispo"`` compute it; only its gradient is meaningful.

    **Defaults and their source.** ``max_weight = 5.0``: ScaleRL's $\epsilon_{max}$ (arXiv
    2510.13786), TRL's recommended ``epsilon_high`` for CISPO. ``min_weight = 0``: no lower
    bound, as in MiniMax-M1 ("we did not impose a lower bound on the IS weight by setting
    $\epsilon_{low}$ to a large value") and TRL. veRL parametrises the same clip as
    ``clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)``: ``max_weight = 5`` is
    ``clip_ratio_high = 4``, ``min_weight = 0`` is ``clip_ratio_low = 1``. The ``cispo`` preset
    aggregates with ``token-mean`` as MiniMax-M1 and TRL do.

    $r$ uses the objective's clamped log-ratio (as veRL's ``cispo``); the gradient flows through
    $\log\pi$ itself, so even a clamped token trains, with weight $\hat r$.

    Metrics: ``clip/high_fraction`` ($r > w_{max}$) and ``clip/low_fraction`` ($r < w_{min}$),
    whatever the sign of A: the tokens whose weight was truncated (they still train).
    """

    kind: Literal["cispo"] = "cispo"
    max_weight: float = Field(5.0, ge=1.0, le=1e6)
    """Upper truncation of the importance weight (ScaleRL / TRL: 5.0)."""
    min_weight: float = Field(0.0, ge=0.0, le=1.0)
    """Lower truncation of the importance weight; 0: none (MiniMax-M1)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r = t.ratio
        is_weight = torch.clamp(r, self.min_weight, self.max_weight)
        adv = t.advantage_rows
        grad = (weight * adv.neg()) * is_weight  # weight first: a zero weight silences padding
        # The value in veRL's order of products (float32 rounding then matches to ~1e-7 of each term);
        # `where` rather than a multiply, so that huge finite padding cannot turn into inf * 0.
        per_token = torch.where(t.valid_bool, is_weight.neg() * adv * t.logprobs, 0.0)
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))
        valid = t.valid.reshape(-1)
        counts = {
            "clip/high_fraction": torch.dot(valid, indicator(torch.gt, r, self.max_weight).reshape(-1)),
            "clip/low_fraction": torch.dot(valid, indicator(torch.lt, r, self.min_weight).reshape(-1)),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        return f"cispo: l = -sg(clip(r, {self.min_weight:g}, {self.max_weight:g})) A log p (gradient only through log p)"
