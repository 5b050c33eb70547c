"""ASPO: flip the importance ratio of positive-advantage tokens, and a soft dual-clip for both signs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.components import Component
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class HighEntropyClip(Component):
    r"""Wider clip ranges for each response's high-entropy tokens (Archer's dual-token constraints).

    A token whose entropy is above the ``quantile`` of its own response's valid-token entropies
    (linear interpolation, as ``torch.nanquantile`` over the row) uses these ranges instead of
    the surrogate's ``eps_low``/``eps_high``. From "Stabilizing Knowledge, Promoting Reasoning:
    Dual-Token Constraints for RLVR" (Archer, arXiv 2507.15778), which ASPO's released code
    (Archer2.0) keeps: 0.8, 0.4, 0.4.
    """

    quantile: float = Field(0.8, ge=0.0, le=1.0)
    """Per-response entropy quantile; tokens strictly above it are high-entropy (Archer2.0: 0.8)."""
    eps_low: float = Field(0.4, ge=0.0, lt=1.0)
    """Lower clip range of high-entropy tokens (Archer2.0: 0.4)."""
    eps_high: float = Field(0.4, ge=0.0, le=10.0)
    """Upper clip range of high-entropy tokens (Archer2.0: 0.4)."""


def _row_quantile(values: torch.Tensor, valid: torch.Tensor, q: float) -> torch.Tensor:
    """``[B, 1]`` linear-interpolation q-quantile of each row's valid values (+inf for an empty row)."""
    inf = float("inf")
    if values.shape[-1] == 0:  # no token at all (T = 0): every row is empty
        return torch.full((values.shape[0], 1), inf, dtype=values.dtype, device=values.device)
    ordered = torch.where(valid, values, inf).sort(dim=-1).values
    n = valid.sum(-1, keepdim=True)
    pos = (n - 1).clamp(min=0).to(torch.float64) * q
    lo = pos.floor().to(torch.int64)
    hi = pos.ceil().to(torch.int64)
    v_lo, v_hi = ordered.gather(-1, lo), ordered.gather(-1, hi)
    frac = (pos - lo).to(values.dtype)
    out = torch.where(frac > 0, v_lo + (v_hi - v_lo) * frac, v_lo)
    return torch.where(n > 0, out, inf)


class ASPO(Surrogate):
    r"""Asymmetric Importance Sampling Policy Optimization (Wang et al., arXiv 2510.06062; code: Archer2.0).

    In PPO, a positive-advantage token's gradient is weighted by $r = \pi/\pi_{old}$: tokens the
    update already made likelier are pushed harder, rare ones less. ASPO flips the weight of
    positive-advantage tokens to $1/r$ (so their update behaves like that of negative ones) and
    replaces the hard dual-clip by a *soft* one that keeps the gradient, CISPO-style, with a
    constant weight $c$. Per token, with $r$ clipped as in PPO ($\epsilon$ per token, see below):

    $A < 0$: $m = \max(r, 1-\epsilon_{low})$;
    if $m > c$: $l = -A\,c\,\log\pi$ (gradient $-Ac$); else $l = -A\,m$ (gradient $-A r$ where
    $r \ge 1-\epsilon_{low}$, else 0).

    $A \ge 0$: $p = \min(r, 1+\epsilon_{high})$;
    if $1/p > c$ (i.e. $r < 1/c$): $l = -A\,c\,\log\pi$ (gradient $-Ac$);
    else $l = -A\,\dfrac{p}{\mathrm{sg}[p]^2} = -A/p$ in value, gradient $-A/r$ where
    $r \le 1+\epsilon_{high}$, else 0 (the clamp's own convention at the bounds).

    This is the released code (``compute_policy_loss_archer`` in wizard-III/Archer2.0), whose
    loss values (with $\log\pi$ in the soft dual-clip branch, $-A/p$ in the flipped one) rlstab
    reproduces along with the gradients; $r$ uses the objective's clamped log-ratio, as theirs.

    **Per-token clip ranges** (``high_entropy``). The released code also gives each response's
    top-20% entropy tokens the wider ranges 0.4/0.4 (Archer's dual-token constraints, computed
    per response); ``high_entropy: null`` uses ``eps_low``/``eps_high`` for every token (then
    the surrogate needs no entropy).

    **Defaults and their source.** ``eps_low = eps_high = 0.2``, ``dual_clip = 3`` for both
    signs: Archer2.0's ``compute_policy_loss_archer`` call and its training scripts
    (``clip_ratio_c=3.0``). The ``aspo`` preset adds ``high_entropy`` {0.8, 0.4, 0.4} and
    ``token-mean``, as the released code runs (which also adds a k3 KL loss with coefficient
    0.001, left to the trainer here).

    Metrics: ``clip/high_fraction`` (A > 0, r > 1 + eps_high), ``clip/low_fraction`` (A < 0,
    r < 1 - eps_low), ``clip/dual_fraction`` (tokens on a soft dual-clip branch; they still
    train, with weight c).
    """

    kind: Literal["aspo"] = "aspo"
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip range for negative-advantage tokens (Archer2.0: 0.2)."""
    eps_high: float = Field(0.2, ge=0.0, le=10.0)
    """Upper clip range for positive-advantage tokens (Archer2.0: 0.2)."""
    dual_clip: float = Field(3.0, gt=1.0, le=1e6)
    """Soft dual-clip constant c for both signs: A < 0 with max(r, 1-eps_low) > c, A > 0 with r < 1/c (Archer2.0: 3)."""
    high_entropy: HighEntropyClip | None = None
    """Wider ranges for each response's high-entropy tokens; null: the same ranges for every token."""

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"entropy"}) if self.high_entropy is not None else frozenset()

    def ranges(self, t: Tokens) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """``(eps_low, eps_high)``: floats, or ``[B, T]`` tensors with ``high_entropy``."""
        he = self.high_entropy
        if he is None:
            return self.eps_low, self.eps_high
        threshold = _row_quantile(t.entropy, t.valid_bool, he.quantile)
        high = t.entropy > threshold
        return torch.where(high, he.eps_low, self.eps_low), torch.where(high, he.eps_high, self.eps_high)

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, adv, c = t.ratio, t.advantage_rows, self.dual_clip
        eps_low, eps_high = self.ranges(t)
        lower, upper = 1.0 - eps_low, 1.0 + eps_high
        neg = adv < 0
        # Negative tokens: m = max(r, lower); positive (and zero): p = min(r, upper).
        clipped_r = torch.where(neg, torch.clamp(r, min=lower), torch.clamp(r, max=upper))
        soft_dual = torch.where(neg, clipped_r > c, clipped_r.reciprocal() > c)
        value = torch.where(soft_dual, c * t.logprobs, torch.where(neg, clipped_r, clipped_r.reciprocal()))
        value = torch.where(t.valid_bool, value, 0.0)  # c log p of huge finite padding may overflow to inf
        inside = torch.where(neg, r >= lower, r <= upper)  # the clamp passes the ratio's gradient (bounds included)
        # d/dlogp: soft dual-clip c; negative r; positive (flipped) 1 / r; zero where clipped.
        slope = torch.where(neg, r, r.reciprocal()) * (inside & ~soft_dual) * unclamped(t)
        slope = torch.where(soft_dual, c, slope)
        w = weight * adv.neg()  # weight first: a zero weight silences padding
        loss = torch.dot(w.reshape(-1), value.reshape(-1))
        grad = w * slope

        valid = t.valid
        pos_f = indicator(torch.gt, adv, 0.0).expand_as(valid) * valid
        neg_f = neg.expand_as(valid) * valid
        counts = {
            "clip/high_fraction": (pos_f * (r > upper)).sum(),
            "clip/low_fraction": (neg_f * (r < lower)).sum(),
            "clip/dual_fraction": (soft_dual * valid).sum(),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        s = (
            f"aspo: A < 0: l = -A max(r, {1 - self.eps_low:g}); A >= 0: l = -A / min(r, {1 + self.eps_high:g}) "
            f"(gradient weight 1/r); soft dual-clip l = -{self.dual_clip:g} A log p where the clipped ratio "
            f"exceeds {self.dual_clip:g} (A < 0) or is below 1/{self.dual_clip:g} (A >= 0)"
        )
        he = self.high_entropy
        if he is not None:
            s += f"; tokens above each response's {he.quantile:g} entropy quantile use ranges {he.eps_low:g}/{he.eps_high:g}"
        return s
