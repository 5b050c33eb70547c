"""GPPO and CE-GPPO: the PPO clip whose clipped tokens keep a bounded gradient."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import SurrogateResult, indicator, unclamped
from rlstab.clipping.clip_range import ClipRange
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class GPPO(ClipRange):
    r"""Gradient-Preserving clipping Policy Optimization (Klear-Reasoner, arXiv 2508.07629,
    the GPPO objective) and its generalisation CE-GPPO (arXiv 2509.20712, the CE-GPPO objective).

    PPO's clip removes the gradient of every token whose ratio left $[1-\epsilon_{low}, 1+\epsilon_{high}]$
    on the side the advantage pushes. GPPO keeps the clipped *value* but writes the bound as
    $c\,\frac{r}{\mathrm{sg}(r)}$, whose derivative with respect to $\log\pi$ is $c$: the token
    still trains, with the gradient of a token sitting on the bound. CE-GPPO scales the two
    out-of-range sides by $\beta_{low}$ and $\beta_{high}$:

    $$l = \begin{cases}
    -\beta_{high}(1+\epsilon_{high})\,\frac{r}{\mathrm{sg}(r)}\,A & A > 0,\ r > 1+\epsilon_{high}\\
    -\beta_{low}(1-\epsilon_{low})\,\frac{r}{\mathrm{sg}(r)}\,A & A < 0,\ r < 1-\epsilon_{low}\\
    -A\,r & \text{otherwise}
    \end{cases}
    \qquad\text{and, for } A < 0,\ l \leftarrow \min(l, -cA) \text{ (dual-clip)}$$

    so the value of a clipped token is $-\beta(1\pm\epsilon)A$ and its derivative with respect to
    $\log\pi$ is the same number. $\beta_{low} = \beta_{high} = 1$ is GPPO (github
    Kwai-Klear/KlearReasoner, ``verl/trainer/ppo/core_algos.py`` ``compute_gppo_loss``, lines
    444-529: the bounds ``(1 -/+ eps) / ratio.detach() * ratio`` at lines 509-512, PPO's max at
    514, the dual-clip at 521; as published its ``only_high`` flag is read as ``only_higher`` at
    line 505, an undefined name, so the formula is the ``else`` branch); other values are
    CE-GPPO (authors' code: github Kwai-Klear/CE-GPPO, ``verl/trainer/ppo/core_algos.py``
    ``compute_gppo_loss_general_beta``, lines 531-620: the three cases at lines 602-606, the
    dual-clip ``torch.min(-A c, .)`` for $A < 0$ at lines 610-617). One kind covers both: the
    authors' CE-GPPO function with $\beta = 1$ is their GPPO function.

    The gradient-preserving branches do not go through the clamped log-ratio: their derivative is
    the bound whatever $r$ (the authors' code clamps nothing). The ``-A r`` branch uses the
    objective's clamped ratio, like every PPO-style surrogate here (no gradient where the
    log-ratio is clamped).

    **Defaults and their source.** ``eps_low = 0.2``, ``eps_high = 0.28``, ``dual_clip = 10``:
    Klear-Reasoner's GPPO runs (github Kwai-Klear/KlearReasoner,
    ``recipe/dapo/perf_run_dapo_ours_math.sh`` lines 25-26 and 100). ``beta_low = beta_high = 1``:
    GPPO. The ``ce_gppo`` preset sets ``beta_low = 0.75``, ``beta_high = 1`` and clips at 0.2/0.2:
    CE-GPPO's 7B run (``recipe/dapo/7B_perf_run_gppo_v1_beta1_075_beta2_1_ours_math.sh`` lines
    25-27, 106, 130-132) and the function printed in their README (``gppo_loss_beta1=0.75``); their
    1.5B run uses ``beta_low = 0.5``.

    Klear-Reasoner's ``only_high`` variant (gradient preserved above the range only) is
    ``beta_low = 0`` for the gradient; its clipped value below the range stays PPO's
    $-(1-\epsilon_{low})A$ there, where this component gives 0 (values differ, gradients agree).

    Metrics: ``clip/high_fraction`` (A > 0, r > 1 + eps_high), ``clip/low_fraction`` (A < 0,
    r < 1 - eps_low): the tokens whose gradient is the bound's; ``clip/dual_fraction``: the
    negative-advantage tokens the dual-clip bounds (no gradient), as fractions of valid tokens.
    """

    kind: Literal["gppo"] = "gppo"
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip range: the bound 1 - eps_low for A < 0 (Klear-Reasoner: 0.2)."""
    eps_high: float = Field(0.28, ge=0.0, le=10.0)
    """Upper clip range: the bound 1 + eps_high for A > 0 (Klear-Reasoner: 0.28)."""
    beta_low: float = Field(1.0, ge=0.0, le=10.0)
    """Scale of the preserved gradient (and value) of A < 0, r < 1 - eps_low tokens (GPPO: 1; CE-GPPO: 0.75)."""
    beta_high: float = Field(1.0, ge=0.0, le=10.0)
    """Scale of the preserved gradient (and value) of A > 0, r > 1 + eps_high tokens (GPPO and CE-GPPO: 1)."""
    dual_clip: float | None = Field(10.0, gt=1.0)
    """Dual-clip constant c (> 1 + eps_high) bounding the loss of A < 0 tokens by -c A; null: off (authors' runs: 10)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, adv = t.ratio, t.advantage_rows
        upper, lower = 1.0 + self.eps_high, 1.0 - self.eps_low
        high = indicator(torch.gt, r, upper) * indicator(torch.gt, adv, 0.0)  # A > 0, r > 1 + eps_high
        low = indicator(torch.lt, r, lower) * indicator(torch.lt, adv, 0.0)  # A < 0, r < 1 - eps_low
        inside = 1.0 - high - low
        # l = -A * c_t with c_t the bound's scaled value (clipped) or r (inside); dl/dlogp = -A * c_t
        # (the clipped branches' derivative is their constant, the inside one's is r where unclamped).
        c = high * (self.beta_high * upper) + low * (self.beta_low * lower) + inside * r
        slope = c - inside * r * (1.0 - unclamped(t))
        neg = indicator(torch.lt, adv, 0.0).expand_as(r)
        if self.dual_clip is not None:  # A < 0: l = min(l, -c A), i.e. c_t capped at the dual constant, no gradient
            dual = indicator(torch.gt, c, self.dual_clip) * neg
            c = torch.where(dual > 0, self.dual_clip, c)
            slope = slope * (1.0 - dual)
        w = weight * adv.neg()  # a zero weight silences padding
        loss = torch.dot(w.reshape(-1), c.reshape(-1))
        grad = w * slope

        valid = t.valid
        counts = {"clip/high_fraction": (high * valid).sum(), "clip/low_fraction": (low * valid).sum()}
        if self.dual_clip is not None:
            counts["clip/dual_fraction"] = (dual * valid).sum()
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        hi, lo = 1.0 + self.eps_high, 1.0 - self.eps_low
        s = (
            f"gppo: l = -A r inside; A > 0, r > {hi:g}: l = -{self.beta_high:g}*{hi:g} A r/sg(r); "
            f"A < 0, r < {lo:g}: l = -{self.beta_low:g}*{lo:g} A r/sg(r) (clipped tokens keep a bounded gradient)"
        )
        return s + self.dual_clip_text()

