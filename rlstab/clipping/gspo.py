"""GSPO: the PPO clip applied to one length-normalised importance ratio per response."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import SurrogateResult, indicator, unclamped
from rlstab.clipping.bounded import clamp_between, clip_counts
from rlstab.clipping.clip_range import ClipRange
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class GSPO(ClipRange):
    r"""Group Sequence Policy Optimization (Zheng et al., arXiv 2507.18071; objective: eq. 5).

    Every token of response $i$ shares one importance ratio, the geometric mean of its token
    ratios over the response's $n_i$ valid tokens (the paper's $s_i(\theta)$, section 4.1):

    $$s_i = \exp\Bigl(\frac{1}{n_i}\sum_{t} \log r_{i,t}\Bigr), \qquad
    l_{i,t} = \max\bigl(-A_{i,t}\, s_i,\; -A_{i,t}\,\mathrm{clip}(s_i, 1-\epsilon_{low}, 1+\epsilon_{high})\bigr)$$

    and, with ``dual_clip`` $c$, $l_{i,t} \leftarrow \min(l_{i,t}, -cA_{i,t})$ for $A_{i,t} < 0$.
    $\log r$ is the objective's clamped log-ratio ($\pm$ ``log_ratio_clamp``), so a token whose
    log-ratio is clamped neither moves $s_i$ further nor receives gradient. The paper aggregates
    per response (eq. 5: $\frac{1}{G}\sum_i$), i.e. ``seq-mean-token-mean`` (the ``gspo`` preset).

    **Which gradient** (``gradient``). The paper's GSPO differentiates through $s_i$ (gradient analysis, section 4.2):
    every token of response $i$ receives $\frac{s_i}{n_i}\sum_{t'} w_{t'}(-A_{t'})\,
    \mathbb{1}[s_i \text{ unclipped for } t']$ — the response's whole weighted, unclipped
    signal spread evenly over its tokens. GSPO-token (section 4.3) uses
    $s_{i,t} = \mathrm{sg}[s_i]\,\pi_{i,t}/\mathrm{sg}[\pi_{i,t}]$, whose derivative is
    $s_i$ for the token's own term only: token $t$ receives $w_t(-A_{i,t})\,s_i$ where unclipped.
    The two are equal when, within each response, the advantage, the clip decision and the
    aggregation weight are the same for every token (GRPO's per-response advantages, no mask,
    no per-token importance weights), which is the paper's setting. They differ under per-token
    advantages, masks that silence part of a response, or ``is_weights``: there ``sequence``
    still trains a silenced token through $s_i$, ``token`` does not.

    - ``sequence`` (default): the paper's GSPO, and what OpenRLHF 0.11.2 computes
      (``PolicyLoss(policy_loss_type="gspo")`` takes $s_i$ with its full gradient).
    - ``token``: GSPO-token, what verl 0.9.1's ``gspo`` loss computes.

    **Defaults and their sources.** ``eps_low = 3e-4``, ``eps_high = 4e-4``: the paper's clipping
    ranges ("the clipping ranges in Equation (5) to 3e-4 and 4e-4", section 5.1); OpenRLHF and verl take them from their PPO clip flags (default 0.2), so
    set them there when running those trainers' own GSPO. ``dual_clip = null``: the paper has
    none; OpenRLHF applies ``--actor.dual_clip`` to GSPO too, verl never does.

    Other differences from the trainers' code, all outside the tested ranges of real runs:
    OpenRLHF does not clamp token log-ratios for GSPO; verl clamps $\log s_{i,t}$ above at 10.

    Metrics: ``clip/high_fraction`` (A > 0, $s_i > 1+\epsilon_{high}$), ``clip/low_fraction``
    (A < 0, $s_i < 1-\epsilon_{low}$), and ``clip/dual_fraction`` (A < 0, $s_i > c$), as
    fractions of valid tokens, as for [`PPOClip`][rlstab.clipping.PPOClip].
    """

    kind: Literal["gspo"] = "gspo"
    eps_low: float = Field(3e-4, ge=0.0, lt=1.0)
    """Lower clip range: s is clipped below at 1 - eps_low (paper: 3e-4)."""
    eps_high: float = Field(4e-4, ge=0.0, le=10.0)
    """Upper clip range: s is clipped above at 1 + eps_high (paper: 4e-4)."""
    dual_clip: float | None = Field(None, gt=1.0)
    """Dual-clip constant c (> 1) bounding the loss of negative-advantage tokens by -c A; null: off (paper)."""
    gradient: Literal["sequence", "token"] = "sequence"
    """``sequence``: differentiate through s_i (paper's GSPO, OpenRLHF); ``token``: GSPO-token (verl)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        valid, adv = t.valid, t.advantage_rows  # adv: [B, 1] or [B, T]
        n = valid.sum(-1, keepdim=True).clamp_(min=1.0)  # [B, 1]
        s = torch.exp((t.log_ratio * valid).sum(-1, keepdim=True) / n)  # [B, 1]: s_i
        lower, upper, cap = self.ratio_bounds()
        s_clip = clamp_between(s, adv, lower, upper, cap)  # [B, 1] or [B, T]: one clamp per token, as for PPOClip
        w = weight * adv.neg()  # [B, T]
        loss = (w * s_clip).sum()
        active = indicator(torch.eq, s_clip, s).expand_as(w)  # s inside the token's clip interval
        signal = w * active  # w_t (-A_t) where the clip leaves the gradient on
        if self.gradient == "token":
            grad = signal * s
        else:  # d s_i / d logp_t = s_i / n_i on every valid token of the response
            grad = (signal.sum(-1, keepdim=True) * s / n) * valid
        grad = grad * unclamped(t)
        return SurrogateResult(loss, grad, clip_counts(t, s.expand_as(w), s_clip.expand_as(w), cap is not None))

    def describe(self) -> str:
        return f"gspo: s_i = exp(mean_t log r_i,t); {self.clip_text('s_i')}; gradient: {self.gradient}"
