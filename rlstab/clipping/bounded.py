"""The PPO clip between explicit ratio bounds, shared by surrogates that choose their own bounds.

[`PPOClip`][rlstab.clipping.PPOClip] takes ``1 - eps_low`` and ``1 + eps_high``; Clip-Cov (whose
authors run with a lower bound of 0) and BAPO (whose bounds change every step) need the same loss
between bounds given as ratios, with a lower bound allowed to reach 0.
"""

from __future__ import annotations

import math

from rlstab.clipping.base import SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


def clip_between(
    t: Tokens, weight: torch.Tensor, lower: float, upper: float, dual_clip: float | None = None
) -> SurrogateResult:
    r"""$\sum_t w_t\,l_t$ with $l = \max(-A r, -A\,\mathrm{clip}(r, c_{low}, c_{high}))$ (and $\min(l, -cA)$ for A < 0).

    The active branch is one clamp per token: A > 0: $l = -A\min(r, c_{high})$; A < 0:
    $l = -A\,\mathrm{clamp}(r, c_{low}, c)$; its derivative is $-A r$ where the clamp leaves $r$
    unchanged, 0 elsewhere. Counts: ``clip/high_fraction`` (A > 0, r > c_high),
    ``clip/low_fraction`` (A < 0, r < c_low) and, with ``dual_clip``, ``clip/dual_fraction``
    (A < 0, r > c).
    """
    r, adv = t.ratio, t.advantage_rows
    dual = math.inf if dual_clip is None else dual_clip
    lo = torch.where(adv > 0, 0.0, lower)
    hi = torch.where(adv < 0, dual, upper)
    r_clip = torch.clamp(r, min=lo, max=hi)
    w = weight * adv.neg()  # multiply the weight first: a zero weight silences any finite padding
    loss = torch.dot(w.reshape(-1), r_clip.reshape(-1))
    active = indicator(torch.eq, r_clip, r)
    grad = w * active * r * unclamped(t)

    valid = t.valid
    pos = indicator(torch.gt, adv, 0.0).expand_as(valid) * valid
    neg = indicator(torch.lt, adv, 0.0).expand_as(valid) * valid
    outside = 1.0 - active
    counts = {"clip/high_fraction": (pos * outside).sum()}
    out_neg = (neg * outside).sum()
    if dual_clip is None:
        counts["clip/low_fraction"] = out_neg
    else:
        n_dual = (neg * indicator(torch.gt, r, dual_clip)).sum()
        counts["clip/low_fraction"] = out_neg - n_dual
        counts["clip/dual_fraction"] = n_dual
    return SurrogateResult(loss, grad, counts)
