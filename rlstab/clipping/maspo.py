"""MASPO: a soft Gaussian gate on the ratio, wider for rare tokens and for confident advantages."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlstab.clipping.base import Surrogate, SurrogateResult, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class MASPO(Surrogate):
    r"""Mass-Adaptive Soft Policy Optimization (arXiv 2602.17550; code: github VenomRose-Juri/MASPO-RL).

    No hard clip. A token whose ratio moved in the direction its advantage pushes (A > 0 and
    r > 1, or A < 0 and r < 1) has its loss scaled by a detached Gaussian gate; every other
    token takes the plain importance-weighted policy gradient:

    $$l = -A\,\mathrm{sg}[g]\,r, \qquad
    g = \begin{cases} \exp\!\Bigl(-\dfrac{(r - 1)^2}{2\sigma^2}\Bigr) & (A > 0,\ r > 1) \text{ or } (A < 0,\ r < 1)\\
    1 & \text{otherwise}\end{cases}
    \qquad \frac{\partial l}{\partial \log\pi} = -A\,g\,r$$

    with a width that grows as the old probability shrinks (mass-adaptive limiter) and with the
    reliability of the advantage's sign (asymmetric risk controller):

    $$\sigma = \mathrm{clip}\!\Bigl(\frac{\sigma_{base}}{p_{old}^{\alpha}},\ \sigma_{base},\ \sigma_{high}\Bigr)\cdot
    \begin{cases}\mathrm{clip}(1 + \beta_+ A,\ a_{low},\ a_{high}) & A > 0\\
    \mathrm{clip}\bigl(1/(1 - \beta_- A),\ a_{low},\ a_{high}\bigr) & A < 0\end{cases}$$

    so a rare token ($p_{old}$ small) may move further, a strongly positive advantage widens the
    gate and a strongly negative one narrows it. This is the authors' released code
    (``compute_policy_loss`` with ``ratio_mode: maspo`` in their veRL fork), which has no
    dual-clip in MASPO mode; $r$ uses the objective's clamped log-ratio, as theirs.

    **Defaults and their source.** $\sigma_{base} = 1$, $\alpha = 0.3$, $\sigma_{high} = 10$,
    $a_{low} = 0.1$, $a_{high} = 10$, $\beta_+ = \beta_- = 0.03$: the authors' README ("default
    recommendation") and example script; they suggest $\alpha = 0.5$ for 1.5B models. The
    ``maspo`` preset aggregates with veRL's default ``token-mean``, as their script runs.

    Metrics: ``maspo/gated_fraction`` (tokens in the gated case) and ``maspo/gate_mean`` (mean
    of $g$ over valid tokens, 1 = no attenuation).
    """

    kind: Literal["maspo"] = "maspo"
    sigma_base: float = Field(1.0, gt=0.0, le=1e3)
    """Base width of the gate (authors: 1)."""
    alpha: float = Field(0.3, ge=0.0, le=10.0)
    """Mass-adaptive exponent: the width scales with p_old^-alpha (authors: 0.3; 0.5 for small models)."""
    sigma_high: float = Field(10.0, gt=0.0, le=1e6)
    """Upper bound of the mass-adaptive width (authors: 10)."""
    beta_pos: float = Field(0.03, ge=0.0, le=10.0)
    """Risk control for positive advantages: width factor 1 + beta_pos A (authors: 0.03)."""
    beta_neg: float = Field(0.03, ge=0.0, le=10.0)
    """Risk control for negative advantages: width factor 1 / (1 - beta_neg A) (authors: 0.03)."""
    adv_low: float = Field(0.1, gt=0.0)
    """Lower bound of the advantage width factor (authors: 0.1)."""
    adv_high: float = Field(10.0, gt=0.0)
    """Upper bound of the advantage width factor (authors: 10)."""

    @model_validator(mode="after")
    def _ranges_in_order(self):
        if self.sigma_base > self.sigma_high:
            raise ValueError(f"sigma_base ({self.sigma_base}) must not exceed sigma_high ({self.sigma_high})")
        if self.adv_low > self.adv_high:
            raise ValueError(f"adv_low ({self.adv_low}) must not exceed adv_high ({self.adv_high})")
        return self

    def gate(self, t: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g, gated)``: the detached gate and the 0/1 indicator of the gated case, ``[B, T]``."""
        r, adv = t.ratio, t.advantage_rows
        p_old = torch.exp(t.old_logprobs)
        mass = torch.clamp(self.sigma_base / p_old**self.alpha, self.sigma_base, self.sigma_high)
        # The negative-branch factor is only used where A < 0, where 1 - beta_neg A >= 1.
        risk = torch.where(
            adv > 0, 1.0 + self.beta_pos * adv, 1.0 / (1.0 - self.beta_neg * torch.clamp(adv, max=0.0))
        ).clamp(self.adv_low, self.adv_high)
        sigma = mass * risk
        gated = ((adv > 0) & (r > 1.0)) | ((adv < 0) & (r < 1.0))
        g = torch.where(gated, torch.exp(-((r - 1.0) ** 2) / 2.0 / sigma**2), 1.0)
        return g, gated.to(torch.float32)

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        g, gated = self.gate(t)
        r = t.ratio
        grad = (weight * t.advantage_rows.neg()) * g * r  # weight first: a zero weight silences padding
        loss = grad.sum()
        grad = grad * unclamped(t)
        valid = t.valid.reshape(-1)
        counts = {
            "maspo/gated_fraction": torch.dot(valid, gated.reshape(-1)),
            "maspo/gate_mean": torch.dot(valid, g.reshape(-1)),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        return (
            f"maspo: l = -A sg(g) r, g = exp(-(r-1)^2 / 2 sigma^2) where r moved with A, "
            f"sigma = clip({self.sigma_base:g} / p_old^{self.alpha:g}, {self.sigma_base:g}, {self.sigma_high:g}) "
            f"* clip(1 + {self.beta_pos:g} A or 1 / (1 - {self.beta_neg:g} A), {self.adv_low:g}, {self.adv_high:g})"
        )
