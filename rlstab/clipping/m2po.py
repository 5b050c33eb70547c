"""M2PO: the importance-weighted policy gradient, trusted up to a budget on the step's second moment of log r."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens

_NONE = (math.inf, math.inf)  # (cut, T): nothing is masked


class M2PO(Surrogate):
    r"""Second-Moment Trust Policy Optimization (Zheng, Zhao and Chen, arXiv 2510.01161: the $\hat M_2$
    metric, Algorithm 1 and the M2PO objective).

    Instead of PPO's per-token clip, M2PO bounds the second moment of the log importance ratio over
    the step, $\hat M_2 = \frac1N\sum_i (\log r_i)^2$, by a budget $\tau_{M_2}$, and silences only the
    tokens with the largest $(\log r)^2$ until the budget holds; every other token trains with the
    unclipped $-A\,r$:

    $$l_{i,t} = -M_{i,t}\,A_{i,t}\,r_{i,t}, \qquad M_{i,t} = \mathbb 1\bigl[(i,t) \notin P \ \vee\ (\log r_{i,t})^2 < x^*\bigr]$$

    with $P$ the step's *population* of tokens and $x^*$ the step's cut on their values
    $v = (\log r)^2$. Aggregation ``token-mean`` over every valid token (masked tokens stay in the
    denominator: the paper's objective divides by $\sum_i |o_i|$).

    **Population** (``population``). ``trust_region`` (default): only the tokens PPO's clip would
    act on, $A > 0 \wedge r > 1$ or $A < 0 \wedge r < 1$ (authors' code: github Infini-AI-Lab/M2PO,
    ``verl/trainer/ppo/core_algos.py`` lines 726-756, the trust-region tokens' squared log-ratios, the
    quadrants at 746-747; Trinity-RFT's reading of the final paper,
    ``trinity/algorithm/policy_loss_fn/m2po_policy_loss.py``, its mask function). ``valid``:
    every valid token (the blog and AReaL: ``areal/trainer/ppo/actor.py``, lines 769-851, sorted descending).

    **Which tokens go** (``rule``), with $v_{(0)} \le \dots \le v_{(n-1)}$ the population's sorted values:

    - ``cap`` (default, the authors' code, ``kpo_clip_harmful_tokens`` and the
      threshold solver before it, lines 683-809): if $\frac1n\sum v \le \tau_{M_2}$ nothing
      goes (line 793). Otherwise $x^*$ is the smallest value with $\sum_j \min(v_j, x^*) \ge \tau_{M_2} n$
      (line 710), and $T$ the largest value below it (0 if none, line 718); the authors then clip the
      ratio to $[e^{-\sqrt T}, e^{\sqrt T}]$ in PPO's max (lines 806-807, 854), which removes the
      gradient of exactly the population tokens with $v \ge x^*$ and leaves their value at the bound,
      $l = -A\,\mathrm{clip}(r, e^{-\sqrt T}, e^{\sqrt T})$. rlstab computes that value too.
    - ``remove`` (the paper's Algorithm 1 as Trinity-RFT and AReaL implement it): keep the longest
      prefix of the sorted values whose mean is at most $\tau_{M_2}$, i.e. $x^*$ is the smallest value
      with $\sum_{v_j \le x^*}(v_j - \tau_{M_2}) > 0$; masked tokens contribute 0.

    Ties at the cut are all masked (so the kept set satisfies the budget whatever the order of
    equal values; the implementations keep part of a tie group by sort order). The authors'
    ``1e-12`` tolerances and their ``1e5`` ratio cap when nothing is clipped are not reproduced;
    AReaL keeps one token when every prefix is over budget, rlstab masks the whole population
    then, as Trinity-RFT and the authors' code (tau = 0) do. AReaL measures $\log r$ between the
    behaviour and the proximal policy of its decoupled loss; rlstab's $r$ is the objective's
    (current over old, clamped).

    **Scope.** The cut is a statistic of the whole optimizer step: ``step_totals`` gathers the
    population's values from every micro-batch and data-parallel rank (``Comm.cat``: one host read
    of the population's size and an all-gather of its values, once per step), sorts them and
    freezes $(x^*, T)$ before any micro-batch loss runs; Trinity-RFT likewise computes one mask over
    the global mini-batch. The authors' code (``verl/workers/actor/dp_actor.py`` lines 361-407) and
    AReaL compute it inside the loss of each micro-batch on each rank (the veRL/OpenRLHF adapters'
    ``step_statistics: local`` gives that reading).

    **Defaults and their source.** ``threshold = 0.04``: $\tau_{M_2}$ in every run of the paper and
    the authors' scripts (``train-scripts/m2po-qwen-math-7b-s256.sh`` line 43, ``M2_budget=0.04``),
    AReaL's example (``examples/math/gsm8k_m2po.yaml``, ``m2_threshold: 0.04``) and Trinity-RFT's
    default. The authors' optional floors ``miniclip_low``/``miniclip_high`` are unset in their
    scripts (None) and are not offered.

    Metrics: ``clip/high_fraction`` and ``clip/low_fraction``: masked tokens with A > 0 and A < 0,
    as fractions of valid tokens; step metrics ``surrogate/m2`` ($\hat M_2$ of the population),
    ``surrogate/m2_after`` (of the kept population for ``remove``; the capped one, as the
    authors log it, for ``cap``), ``surrogate/population`` and ``surrogate/masked`` (counts).
    """

    kind: Literal["m2po"] = "m2po"
    threshold: float = Field(0.04, gt=0.0, le=1e3)
    """tau_M2: the budget on the mean of (log r)^2 over the population (paper and authors' scripts: 0.04)."""
    population: Literal["trust_region", "valid"] = "trust_region"
    """Tokens the budget runs over: PPO's trust-region quadrants (authors' code) or every valid token (AReaL)."""
    rule: Literal["cap", "remove"] = "cap"
    """``cap``: the authors' code (budget on the capped values, clip at the bound); ``remove``: Algorithm 1 (mean of the kept)."""

    # ------------------------------------------------------------------ step

    def _values(self, t: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """``(v, member)``: ``(log r)^2`` ``[B, T]`` and the bool population."""
        lr = t.log_ratio
        member = t.valid_bool
        if self.population == "trust_region":
            adv = t.advantage_rows
            member = member & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))
        return lr.square(), member

    def step_totals(self, tokens: list[Tokens], comm) -> torch.Tensor | None:
        """``[x*, T, M2 before, M2 after, population, masked]`` (float64) over the step's micro-batches and ranks."""
        if not tokens:
            return None
        members = []
        for t in tokens:
            v, member = self._values(t)
            members.append(v[member].to(torch.float64))  # host read: the population's size is data-dependent
        values = comm.cat(torch.cat(members)).sort().values
        return torch.tensor(self._cut(values), dtype=torch.float64)

    def _cut(self, s: torch.Tensor) -> list[float]:
        n = s.numel()
        if n == 0:
            return [*_NONE, 0.0, 0.0, 0.0, 0.0]
        tau = self.threshold
        m2 = float(s.mean())
        if self.rule == "remove":
            over = torch.cumsum(s - tau, 0) > 0  # False up to the longest prefix within budget, then True
            if not bool(over.any()):
                return [*_NONE, m2, m2, float(n), 0.0]
            k = int(over.to(torch.int8).argmax())
            cut = float(s[k])
            kept = s[s < cut]
            return [cut, math.inf, m2, float(kept.mean()) if kept.numel() else 0.0, float(n), float(n - kept.numel())]
        if m2 <= tau:
            return [*_NONE, m2, m2, float(n), 0.0]
        below = torch.cumsum(s, 0) - s  # sum of the values before each position
        capped = below + s * torch.arange(n, 0, -1, dtype=s.dtype, device=s.device)  # sum_j min(v_j, s_k)
        k = int((capped >= tau * n).to(torch.int8).argmax())  # exists: capped[-1] = sum v > tau n
        cut = float(s[k])
        bound = float(s[k - 1]) if k > 0 else 0.0
        after = (float(below[k]) + bound * (n - k)) / n
        return [cut, bound, m2, after, float(n), float(n - k)]

    def begin_step(self, sums, state):
        if sums is None:
            return (*_NONE, 0.0, 0.0, 0.0, 0.0), state
        return tuple(sums.tolist()), state  # host read, once per step (the gather synchronised already)

    def step_metrics(self, step_value) -> dict[str, float]:
        _, _, m2, after, n, masked = step_value
        return {"m2": m2, "m2_after": after, "population": n, "masked": masked}

    # ------------------------------------------------------------------ loss

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        cut, bound = _NONE if step is None else step[:2]
        r, adv = t.ratio, t.advantage_rows
        w = weight * adv.neg()  # a zero weight silences padding
        pos = indicator(torch.gt, adv, 0.0)
        if math.isinf(cut):
            masked = torch.zeros_like(r)
        else:
            v, member = self._values(t)
            masked = indicator(torch.ge, v, cut) * member
        keep = 1.0 - masked
        value = keep * r
        if self.rule == "cap" and not math.isinf(cut):  # the authors' clipped value: -A clip(r, e^-sqrt T, e^sqrt T)
            root = math.sqrt(bound)
            value = value + masked * torch.clamp(r, math.exp(-root), math.exp(root))
        loss = torch.dot(w.reshape(-1), value.reshape(-1))
        grad = w * keep * r * unclamped(t)
        masked = masked * t.valid
        counts = {
            "clip/high_fraction": (masked * pos).sum(),
            "clip/low_fraction": (masked * indicator(torch.lt, adv, 0.0)).sum(),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        pop = "trust-region tokens (A > 0, r > 1 or A < 0, r < 1)" if self.population == "trust_region" else "valid tokens"
        how = (
            "the largest (log r)^2 until sum_j min(v_j, x) >= tau n (then clipped at exp(+-sqrt T))"
            if self.rule == "cap"
            else "the largest (log r)^2 until the mean of the rest <= tau"
        )
        return f"m2po: l = -M A r, M silences among the step's {pop} {how}, tau = {self.threshold:g}"
