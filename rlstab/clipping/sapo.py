"""SAPO: a smooth, temperature-controlled gate on the ratio instead of a hard clip."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class SAPO(Surrogate):
    r"""Soft Adaptive Policy Optimization (Gao et al., arXiv 2511.20347).

    The hard clip is replaced by a sigmoid gate whose slope at $r = 1$ is one, so near-on-policy
    tokens train exactly as in PPO and far-off-policy tokens fade out smoothly instead of being
    cut off:

    $$l = -A\, f_\tau(r), \qquad f_\tau(r) = \frac{4}{\tau}\,\sigma\bigl(\tau (r - 1)\bigr),
    \qquad \tau = \begin{cases}\tau_{pos} & A > 0\\ \tau_{neg} & A \le 0\end{cases}$$

    $$\frac{\partial l}{\partial \log\pi} = -A\; 4\,\sigma(1-\sigma)\; r
    \qquad(\sigma = \sigma(\tau(r-1));\ \text{the gradient weight } 4\sigma(1-\sigma) = 1 \text{ at } r = 1)$$

    A larger $\tau$ makes the gate decay faster; the paper uses $\tau_{neg} > \tau_{pos}$
    because negative-advantage updates spread probability over the whole vocabulary and
    destabilise training sooner.

    **Defaults and their source.** ``tau_pos = 1.0``, ``tau_neg = 1.05``: the paper's values,
    also veRL 0.9.1's (``actor.tau_pos``/``tau_neg``) and TRL 1.16's
    (``sapo_temperature_pos``/``sapo_temperature_neg``). The paper aggregates per response (the
    ``sapo`` preset uses ``seq-mean-token-mean``; veRL's ``sapo`` loss always does, whatever
    ``loss_agg_mode`` says). $A = 0$ takes $\tau_{neg}$, as in veRL (its loss is 0 either way).
    $r$ uses the objective's clamped log-ratio (as veRL's ``sapo``), so a clamped token gets no
    gradient.

    Metrics: ``sapo/gradient_weight_mean``, the mean over valid tokens of
    $4\sigma(1-\sigma)$ (1 on-policy; how much of the plain policy gradient the gate lets through).
    """

    kind: Literal["sapo"] = "sapo"
    tau_pos: float = Field(1.0, gt=0.0, le=100.0)
    """Gate temperature for tokens with a positive advantage (paper: 1.0)."""
    tau_neg: float = Field(1.05, gt=0.0, le=100.0)
    """Gate temperature for tokens with a zero or negative advantage (paper: 1.05)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, adv = t.ratio, t.advantage_rows
        tau = torch.where(adv > 0, self.tau_pos, self.tau_neg)
        sig = torch.sigmoid(tau * (r - 1.0))
        w = weight * adv.neg()
        loss = torch.dot(w.reshape(-1), (sig * (4.0 / tau)).reshape(-1))
        gate_weight = sig * (1.0 - sig) * 4.0  # d f / d r
        grad = w * gate_weight * r * unclamped(t)
        counts = {"sapo/gradient_weight_mean": torch.dot(t.valid.reshape(-1), gate_weight.reshape(-1))}
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        return (
            f"sapo: l = -A (4/tau) sigmoid(tau (r - 1)), tau = {self.tau_pos:g} if A > 0 else {self.tau_neg:g}"
        )
