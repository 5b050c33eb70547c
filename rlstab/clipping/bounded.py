"""The PPO clip between explicit ratio bounds: the one clamp, its clip counts, and the loss of PPO-style surrogates.

[`PPOClip`][rlstab.clipping.PPOClip] takes ``1 - eps_low`` and ``1 + eps_high`` (and its dual-clip or delta cap:
``ClipRange.ratio_bounds()``); Clip-Cov (whose authors run with a lower bound of 0) and BAPO (whose bounds change
every step) need the same loss between bounds given as ratios, with a lower bound allowed to reach 0. GSPO clamps its sequence ratio with ``clamp_between`` and
counts with ``clip_counts``, and keeps its own loss and gradient (through $s_i$).
"""

from __future__ import annotations

import math

from rlstab.clipping.base import SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


def clamp_between(
    x: torch.Tensor, adv: torch.Tensor, lower: float, upper: float, cap: float | None = None
) -> torch.Tensor:
    r"""Each token's ratio ``x`` clamped to its clip interval: A > 0: $x \le c_{high}$; A < 0:
    $c_{low} \le x \le c$ (``cap``: the dual-clip; None: no cap); A = 0: $x \le c_{high}$ (its loss
    weight $-A$ is a zero whatever the bounds).

    One clamp with per-token (or per-response) bounds is the active branch of PPO's max (and of the
    dual min): A > 0: $l = -A\min(x, c_{high})$; A < 0: $l = -A\,\mathrm{clamp}(x, c_{low}, c)$.
    Broadcasts ``x`` (``[B, T]`` or ``[B, 1]``) against ``adv`` (``[B, 1]`` or ``[B, T]``).
    """
    neg = adv < 0
    lo = neg * lower  # 0 where A >= 0: no lower bound there, since x > 0
    hi = torch.where(neg, math.inf if cap is None else cap, upper)
    return torch.clamp(x, min=lo, max=hi)


def clip_counts(t: Tokens, x: torch.Tensor, x_clip: torch.Tensor, dual: bool) -> dict[str, torch.Tensor]:
    """Valid tokens whose ratio ``x`` lies outside its clip interval (``x_clip``, from ``clamp_between``; both
    ``[B, T]``), by the sign of A: above it (A > 0: ``clip/high_fraction``; A < 0: ``clip/dual_fraction``,
    beyond the dual-clip, counted with ``dual``) or below it (A < 0: ``clip/low_fraction``). Counts of 0/1
    values: exact whichever way they are summed (float32 up to 2**24 tokens)."""
    valid = t.valid
    above, below = indicator(torch.gt, x, x_clip), indicator(torch.lt, x, x_clip)
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


def clip_between(
    t: Tokens, weight: torch.Tensor, lower: float, upper: float, dual_clip: float | None = None
) -> SurrogateResult:
    r"""$\sum_t w_t\,l_t$ with $l = \max(-A r, -A\,\mathrm{clip}(r, c_{low}, c_{high}))$ (and $\min(l, -cA)$ for A < 0).

    The active branch is one clamp per token (``clamp_between``): A > 0: $l = -A\min(r, c_{high})$;
    A < 0: $l = -A\,\mathrm{clamp}(r, c_{low}, c)$; its derivative is $-A r$ where the clamp leaves $r$
    unchanged, 0 elsewhere (and where the log-ratio was clamped). Counts (``clip_counts``):
    ``clip/high_fraction`` (A > 0, r > c_high), ``clip/low_fraction`` (A < 0, r < c_low) and, with
    ``dual_clip``, ``clip/dual_fraction`` (A < 0, r > c).
    """
    r, adv = t.ratio, t.advantage_rows  # adv: [B, 1] (one per response) or [B, T]
    r_clip = clamp_between(r, adv, lower, upper, dual_clip)
    w = weight * adv.neg()  # multiply the weight first: a zero weight silences any finite padding
    loss = torch.dot(w.view(-1), r_clip.view(-1))
    # d l / d logp = -A r where r is inside its clip interval (r_clip == r), 0 where clipped.
    grad = w.mul_(indicator(torch.eq, r_clip, r)).mul_(r).mul_(unclamped(t))
    return SurrogateResult(loss, grad, clip_counts(t, r, r_clip, dual_clip is not None))
