"""Lp-Reg: the PPO clip, and on the step's least likely negative tokens a KL pull toward a min-p proxy."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens, f32

FILTERED_LOGIT = -1e4
"""The logit a token below the min-p threshold gets in the proxy (the authors' ``apply_min_p``)."""
KL_CLAMP = 10.0
"""veRL's ``low_var_kl`` clamps the k3 estimate to [-10, 10] (``kl_penalty``)."""


def min_p_proxy_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor, min_p: float) -> torch.Tensor:
    r"""``[...]`` log-probability of ``tokens`` under Lp-Reg's proxy of the distributions ``logprobs`` (``[..., V]``).

    The proxy keeps the tokens with $\pi(v) \ge \kappa \max_u \pi(u)$ (min-p, $\kappa$ = ``min_p``),
    sets every other logit to $-10^4$ and renormalises (github CarlanLark/Lp-Reg-dev,
    ``verl/workers/actor/dp_actor.py`` ``apply_min_p``, lines 76-110, ``regular_type: minp``,
    ``minp_soft: false``). A kept token's proxy log-probability is
    $\log\pi(y) - \log\sum_{kept}\pi(v)$, above its own; a filtered one's is about $-10^4$.
    """
    logprobs = logprobs.float()
    keep = logprobs >= logprobs.amax(-1, keepdim=True) + math.log(min_p)
    proxy = torch.log_softmax(torch.where(keep, logprobs, FILTERED_LOGIT), dim=-1)
    return proxy.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class LpReg(Surrogate):
    r"""Low-probability Regularization (Huang et al., arXiv 2510.03222: the proxy
    distribution and the Lp-Reg objective).

    RLVR drives the probability of rare but useful tokens ("reasoning sparks") to zero through
    negative advantages. Lp-Reg builds a less noisy proxy of the policy, the min-p filtered and
    renormalised next-token distribution $\pi_{proxy}$ (tokens below $\kappa \max \pi$ removed,
    see [`min_p_proxy_logprobs`][rlstab.clipping.lp_reg.min_p_proxy_logprobs]), and pulls the
    step's least likely negative tokens back toward it whenever the proxy gives them more
    probability than the policy does:

    $$l_t = \begin{cases}
    -A\,r + \beta\,\mathrm{clamp}\bigl(\tfrac{\pi_{proxy}}{\pi} - \log\tfrac{\pi_{proxy}}{\pi} - 1,\ -10,\ 10\bigr) &
    t \in S,\ \log\pi(y_t) < \log\pi_{proxy}(y_t)\\
    \max\bigl(-A r,\ -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\bigr) & \text{otherwise}
    \end{cases}$$

    with $S$ the $k = \lfloor\rho_- n_-\rfloor$ negative-advantage tokens of lowest current
    log-probability among the step's $n_-$ (and likewise $\rho_+$ on positive ones), the KL term
    veRL's ``low_var_kl`` (k3) estimate, and the regularised tokens' policy term unclipped. Its
    derivative with respect to $\log\pi$ is $\beta(1 - \pi_{proxy}/\pi)$ (0 where the clamp binds).

    **Family.** The authors' code (github CarlanLark/Lp-Reg-dev, ``verl/trainer/ppo/core_algos.py``
    ``compute_policy_loss_lp_reg``, lines 648-745) *replaces* the clipped policy term of the
    selected tokens by the unclipped one plus the KL term (line 721), so Lp-Reg is a surrogate here,
    not a regulariser added beside one: the selection is a statistic of the step, which a surrogate
    receives.

    **Choices and their source** (authors' code and their recipes, ``recipe/lp_reg/*.sh``):

    - $\pi_{proxy}$ from the old policy at the rollout temperature (``minp_old_log_prob=True`` in
      every recipe; ``fsdp_workers.py`` ``compute_minp_log_prob``, lines 737-775): the batch
      carries it as ``TokenBatch.proxy_logprobs``, which only a trainer can compute (it needs the
      whole next-token distribution). rlstab's embedded trainer computes it in its old-policy
      pass with ``min_p``; the veRL, OpenRLHF and TRL adapters refuse this component at start-up.
    - ``min_p = 0.02`` ($\kappa$, ``minp_p_threshold``), ``negative_fraction = 0.01``
      (``logp_neg_k_percent``: Qwen3-14B recipes; the Qwen2.5-32B ones use 0.005),
      ``positive_fraction = 0`` (``logp_pos_k_percent``), ``coef = 1`` ($\beta$, ``ppo_kl_coef``),
      ``eps_low = 1``, ``eps_high = 9`` (``clip_ratio_low``/``clip_ratio_high``: the clip is
      $[0, 10]$, and no dual-clip in this loss).
    - $k = \lfloor \rho n\rfloor$ and nothing when $k < 2$ (lines 735-736: ``max(1, int(n * pct))``
      then ``if k > 1``). The lowest log-probabilities are the current policy's (line 738).

    **Scope.** $n_-$ and the $k$-th lowest log-probability are taken over the whole optimizer step
    (every micro-batch and data-parallel rank, exact order statistics by
    [`rlstab.quantile`][rlstab.quantile]) and frozen before the micro-batch losses; tokens tied
    with the $k$-th value are all selected. The authors select within each micro-batch on each
    rank (the loss function's ``topk``); the veRL/OpenRLHF adapters' ``step_statistics: local``
    would give that reading, but those adapters cannot supply the proxy.

    Metrics: ``clip/high_fraction`` / ``clip/low_fraction`` as for PPO clip (unregularised tokens),
    ``lp_reg/regularised_fraction`` (the tokens with the KL term); step metrics
    ``surrogate/selected_negative``, ``surrogate/selected_positive`` ($k$).
    """

    kind: Literal["lp_reg"] = "lp_reg"
    min_p: float = Field(0.02, gt=0.0, lt=1.0)
    """kappa: the proxy keeps tokens with pi(v) >= kappa * max pi (authors' recipes: 0.02). Read by the trainer."""
    negative_fraction: float = Field(0.01, ge=0.0, le=1.0)
    """rho-: share of the step's negative-advantage tokens, lowest log-probability first, that may be regularised (0.01)."""
    positive_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """rho+: the same among positive-advantage tokens (authors' recipes: 0, none)."""
    coef: float = Field(1.0, ge=0.0, le=1e3)
    """beta: weight of the KL term (ppo_kl_coef: 1)."""
    eps_low: float = Field(1.0, ge=0.0, le=1.0)
    """Lower clip range of the other tokens' PPO clip (authors' recipes: 1.0, i.e. no lower bound)."""
    eps_high: float = Field(9.0, ge=0.0, le=100.0)
    """Upper clip range of the other tokens' PPO clip (authors' recipes: 9.0, i.e. r clipped at 10)."""

    reads: ClassVar[frozenset[str]] = frozenset({"proxy_logprobs"})

    # ------------------------------------------------------------------ step

    def step_totals(self, tokens: list[Tokens], comm) -> torch.Tensor | None:
        """``[cut-, n-, k-, cut+, n+, k+]``: the k-th lowest current log-probability of each sign (-inf: none)."""
        from rlstab.quantile import Population

        if not tokens:
            return None
        out = []
        for sign, fraction in ((-1.0, self.negative_fraction), (1.0, self.positive_fraction)):
            chunks = [(t.logprobs, t.valid_bool & (t.advantages * sign > 0)) for t in tokens]
            population = Population(chunks, comm)
            n = population.size
            k = int(n * fraction)  # the authors' int(len(indices) * pct)
            cut = float(population.order_statistic(k - 1)) if k > 1 else -math.inf
            out += [cut, float(n), float(k if k > 1 else 0)]
        return torch.tensor(out, dtype=torch.float64)

    def begin_step(self, sums, state):
        if sums is None:
            return (-math.inf, 0.0, 0.0, -math.inf, 0.0, 0.0), state
        return tuple(sums.tolist()), state  # host read, once per step

    def step_metrics(self, step_value) -> dict[str, float]:
        return {"selected_negative": step_value[2], "selected_positive": step_value[5]}

    # ------------------------------------------------------------------ loss

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        neg_cut, _, _, pos_cut, _, _ = step if step is not None else (-math.inf, 0, 0, -math.inf, 0, 0)
        r, adv, lp, valid = t.ratio, t.advantage_rows, t.logprobs, t.valid_bool
        proxy = torch.where(valid, f32(t.batch.proxy_logprobs), lp)  # padding may hold anything
        selected = ((adv < 0) & (lp <= neg_cut)) | ((adv > 0) & (lp <= pos_cut))
        reg = selected & valid & (lp < proxy)
        regf = reg.to(r.dtype)

        # The policy term: PPO clip (one clamp per token, as PPOClip without dual-clip), unclipped where regularised.
        lo = torch.where(adv > 0, 0.0, 1.0 - self.eps_low)
        hi = torch.where(adv < 0, math.inf, 1.0 + self.eps_high)
        r_clip = torch.where(reg, r, torch.clamp(r, min=lo, max=hi))
        w = weight * adv.neg()
        loss = torch.dot(w.reshape(-1), r_clip.reshape(-1))
        active = indicator(torch.eq, r_clip, r)
        grad = w * active * r * unclamped(t)

        # The KL term on the regularised tokens: k3 = e^d - d - 1, d = log p_proxy - log p; dk3/dlogp = 1 - e^d.
        # (d above ~2.6 puts k3 past the clamp; capping d at 50 keeps e finite and changes nothing)
        d = torch.where(reg, proxy - lp, 0.0).clamp_(max=50.0)
        e = torch.exp(d)
        k3 = e - d - 1.0
        inside = indicator(torch.lt, k3, KL_CLAMP)
        loss = loss + self.coef * torch.dot(weight.reshape(-1), (regf * k3.clamp(max=KL_CLAMP)).reshape(-1))
        grad = grad + weight * regf * (self.coef * inside) * (1.0 - e)

        vf = t.valid
        outside = (1.0 - active) * vf
        counts = {
            "clip/high_fraction": (outside * indicator(torch.gt, adv, 0.0)).sum(),
            "clip/low_fraction": (outside * indicator(torch.lt, adv, 0.0)).sum(),
            "lp_reg/regularised_fraction": regf.sum(),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        return (
            f"lp_reg: l = max(-A r, -A clip(r, {1 - self.eps_low:g}, {1 + self.eps_high:g})); on the step's "
            f"lowest-log p {self.negative_fraction:g} of A < 0 tokens"
            + (f" and {self.positive_fraction:g} of A > 0 tokens" if self.positive_fraction else "")
            + f" with p < p_proxy: l = -A r + {self.coef:g} * k3(p_proxy, p) (clamped at 10), "
            f"p_proxy = the old policy's min-p ({self.min_p:g}) renormalised distribution"
        )
