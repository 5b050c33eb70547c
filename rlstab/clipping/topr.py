"""TOPR: REINFORCE on positive responses, truncated importance weights on negative ones."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class TOPR(Surrogate):
    r"""Tapered Off-Policy REINFORCE (Le Roux et al., arXiv 2503.14286, eq. 8).

    Positive responses train as supervised fine-tuning (no importance weight, so their
    probability can grow without a trust region); negative ones are pushed down with the
    importance weight truncated to $[0, 1]$, which tapers the update once the policy already
    gives them less probability than the behaviour policy did:

    $$\nabla J = \sum_{A > 0} A\,\nabla\log\pi \;+\; \sum_{A < 0} \mathrm{sg}\bigl[\mathrm{clip}(\rho, 0, 1)\bigr]\,A\,\nabla\log\pi,
    \qquad l = -\alpha\,A\,\log\pi,\quad \alpha = \begin{cases} w_+ & A > 0\\ w_-\,\mathrm{sg}[\min(\rho, 1)] & A \le 0\end{cases}$$

    with $\rho$ the importance ratio $\pi/\mu$ and $\mathrm{sg}$ the stop-gradient; the gradient
    with respect to $\log\pi$ is $-\alpha A$. As for CISPO, the loss *value* contains $\log\pi$
    (as the implementations compute it); only its gradient is meaningful.

    **Which ratio** (``ratio_level``). The paper truncates the trajectory ratio
    $\pi(\tau)/\mu(\tau)$ (eq. 8). Its public implementations use the token ratio: ROLL
    (github alibaba/ROLL, ``roll/pipeline/agentic/agentic_actor_pg_worker.py``
    its TOPR loss method, lines 260-349: eq. 8 in the docstring, then ``torch.clamp(ratio, 0, 1).detach()`` on
    the negative tokens) and Trinity-RFT (``trinity/algorithm/policy_loss_fn/topr_policy_loss.py``,
    ``ratio_clamped = torch.clamp(ratio, 0, 1)``). The authors published no code.

    - ``token`` (default, ROLL and Trinity-RFT): $\rho_{i,t} = r_{i,t}$.
    - ``sequence`` (the paper): $\rho_i = \exp(\sum_t \log r_{i,t})$ over the response's valid
      tokens, one weight per response.

    **Which responses are negative.** Trinity-RFT splits on the sign of the advantage
    (``rewards <= advantage_threshold``, threshold 0, with the advantages standing for the
    rewards: "we can use advantages as rewards (Baseline Trick)"); ROLL splits on the episode
    score (``scores > 0``). rlstab splits on the advantage, as Trinity-RFT; with advantages equal
    to the rewards (the paper's setting) the two agree. A zero advantage contributes nothing
    either way.

    **Defaults and their source.** ``positive_weight = negative_weight = 1``: ROLL's
    ``topr_positive_weight`` / ``topr_negative_weight`` (``roll/configs/worker_config.py``),
    which multiply each set's loss; Trinity-RFT has none (1). ``token-mean`` aggregation in the
    ``topr`` preset: both implementations' ``loss_agg_mode`` default. The ratio is the
    objective's clamped one.

    Metrics: ``clip/high_fraction``: negative-advantage tokens whose weight was truncated to 1
    ($\rho > 1$), as a fraction of valid tokens.
    """

    kind: Literal["topr"] = "topr"
    ratio_level: Literal["token", "sequence"] = "token"
    """``token``: each token's ratio (ROLL, Trinity-RFT); ``sequence``: the response's ratio (paper, eq. 8)."""
    positive_weight: float = Field(1.0, ge=0.0, le=1e3)
    """Multiplier of the positive-advantage responses' term (ROLL's topr_positive_weight: 1)."""
    negative_weight: float = Field(1.0, ge=0.0, le=1e3)
    """Multiplier of the negative-advantage responses' term (ROLL's topr_negative_weight: 1)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        adv = t.advantage_rows
        if self.ratio_level == "token":
            log_rho = t.log_ratio
        else:  # the response's log-ratio, on every token of the row (padding contributes 0)
            log_rho = (t.log_ratio * t.valid).sum(-1, keepdim=True).expand_as(t.log_ratio)
        truncated = torch.exp(log_rho.clamp(max=0.0))  # min(rho, 1) without overflow
        positive = indicator(torch.gt, adv, 0.0)
        alpha = positive * self.positive_weight + (1.0 - positive) * (self.negative_weight * truncated)
        grad = (weight * adv.neg()) * alpha  # weight first: a zero weight silences padding
        # `where` rather than a multiply, so that finite garbage in padding never becomes inf * 0.
        per_token = torch.where(t.valid_bool, alpha.neg() * adv * t.logprobs, 0.0)
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))
        over = indicator(torch.gt, log_rho, 0.0) * (1.0 - positive) * indicator(torch.ne, adv, 0.0) * t.valid
        return SurrogateResult(loss, grad, {"clip/high_fraction": over.sum()})

    def describe(self) -> str:
        rho = "r" if self.ratio_level == "token" else "prod_t r (per response)"
        wp = "" if self.positive_weight == 1.0 else f"{self.positive_weight:g} "
        wn = "" if self.negative_weight == 1.0 else f"{self.negative_weight:g} "
        return (
            f"topr: l = -{wp}A log p for A > 0; l = -{wn}sg(clip({rho}, 0, 1)) A log p for A < 0 "
            "(gradient only through log p)"
        )
