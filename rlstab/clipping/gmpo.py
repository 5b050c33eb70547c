"""GMPO: the geometric mean of each response's token-clipped importance ratios."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class GMPO(Surrogate):
    r"""Geometric-Mean Policy Optimization (Zhao et al., arXiv 2507.20673, section 3).

    GRPO maximises the *arithmetic* mean of a response's token rewards $r_{i,t} A_i$, which one
    outlier ratio can dominate; GMPO maximises their *geometric* mean, with the PPO clip applied
    to each token's log-ratio (in log space, "clipping at token level"):

    $$\hat\ell_{i,t} = \begin{cases} \min(\log r_{i,t},\ \epsilon_{high}) & A_{i,t} > 0\\
      \max(\log r_{i,t},\ -\epsilon_{low}) & A_{i,t} < 0\\ 0 & A_{i,t} = 0\end{cases}
      \qquad s_i = \exp\Bigl(\frac{1}{n_i}\sum_t \hat\ell_{i,t}\Bigr), \qquad l_{i,t} = -A_{i,t}\, s_i$$

    over the response's $n_i$ valid tokens. The paper's objective
    $\frac1G\sum_i \bigl(\prod_t |\min(r A, \mathrm{clip}(r) A)|\bigr)^{1/|o_i|}\mathrm{sgn}(A_i)$
    is $\frac1G\sum_i A_i s_i$ for a per-response advantage, i.e. this loss under
    ``seq-mean-token-mean`` (the ``gmpo`` preset, and what veRL computes whatever its
    ``loss_agg_mode``). A per-token advantage enters as its token mean over the response
    ($\frac{1}{n_i}\sum_t -A_{i,t} s_i$ under ``seq-mean-token-mean``), as veRL averages it.

    Gradient: $s_i$ depends on every token of the response, so token $t$ receives
    $\frac{s_i}{n_i}\,\mathbb 1[\hat\ell_{i,t} = \log r_{i,t}]\sum_{t'} w_{t'}(-A_{i,t'})$: the
    response's whole weighted signal, spread over its unclipped tokens (the paper's gradient analysis, section 3).

    **Defaults and their source.** ``eps_low = eps_high = 0.4``: the clip range
    $(e^{-0.4}, e^{0.4})$ of the paper (section 4) and of the authors' scripts
    (github ``callsys/GMPO``, ``scripts/qwen2.5-math-7b-gmpo.sh`` line 20: ``CLIPRANGE=0.4``, used
    symmetrically in ``train_zero_math_gmpo.py`` lines 675-688, ``critic_type_modify == "gmpo"``:
    one response per micro-batch, loss $-A_i s_i$), and veRL's
    ``examples/gmpo_trainer`` (``clip_ratio_low = clip_ratio_high = 0.4``). veRL's ``geo_mean``
    reads its bounds from ``clip_ratio_low`` / ``clip_ratio_high`` and applies them to the
    log-ratio exactly like this; so does TRL 1.16's ``trl.experimental.gmpo.GMPOTrainer``
    (``epsilon = 0.4``).

    **Where it follows veRL rather than the authors' code** (``compute_policy_loss_geo_mean``,
    veRL 0.9.1 ``verl/trainer/ppo/core_algos.py``): $A = 0$ gives $\hat\ell = 0$ (veRL's
    ``torch.sign``; the authors treat $A = 0$ as positive, line 680 — the same loss and gradient for a
    per-response advantage, where $A_i = 0$ zeroes the response). $\log r$ is the objective's
    clamped log-ratio ($\pm$ ``log_ratio_clamp``; veRL does not clamp), so a token whose
    log-ratio is clamped neither moves $s_i$ further nor receives gradient.

    **Where veRL's ``geo_mean`` differs from rlstab's aggregation.** veRL takes
    ``torch.mean`` over the micro-batch's rows (empty rows included, and whatever
    ``global_batch_info`` says); rlstab's ``seq-mean-token-mean`` divides by the step's
    responses with at least one valid token. They agree for a step of one micro-batch without
    empty responses. veRL folds ``rollout_is_weights`` into one per-response weight, their
    geometric mean over the response; rlstab multiplies each token's term by its own weight
    (their arithmetic mean, under ``seq-mean-token-mean``); the two agree for per-response
    weights (sequence-level TIS). $n_i$ and the mean run over the response's valid tokens, which
    a rejection mask with ``rejected: padding`` reduces (as veRL's edited ``response_mask``); other
    masks silence a token's own term but not its share of $s_i$, as for
    [`GSPO`][rlstab.clipping.GSPO].

    Metrics: ``clip/high_fraction`` (A > 0, $\log r > \epsilon_{high}$) and
    ``clip/low_fraction`` (A < 0, $\log r < -\epsilon_{low}$): the tokens the clip takes out of
    the gradient, as fractions of valid tokens.
    """

    kind: Literal["gmpo"] = "gmpo"
    eps_low: float = Field(0.4, ge=0.0, le=20.0)
    """Lower clip of the log-ratio: log r >= -eps_low for A < 0 (paper and authors' code: 0.4)."""
    eps_high: float = Field(0.4, ge=0.0, le=20.0)
    """Upper clip of the log-ratio: log r <= eps_high for A > 0 (paper and authors' code: 0.4)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        valid, adv = t.valid, t.advantage_rows  # adv: [B, 1] or [B, T]
        x = t.log_ratio
        # One clamp per token is the branch the min (A > 0) or max (A < 0) picks; A = 0 contributes 0.
        lo = torch.where(adv < 0, -self.eps_low, -math.inf)
        hi = torch.where(adv > 0, self.eps_high, math.inf)
        clipped = torch.clamp(x, min=lo, max=hi) * (adv != 0)
        n = valid.sum(-1, keepdim=True).clamp_(min=1.0)  # [B, 1]
        s = torch.exp((clipped * valid).sum(-1, keepdim=True) / n)  # [B, 1]: s_i
        w = weight * adv.neg()  # [B, T]
        loss = (w * s).sum()
        active = indicator(torch.eq, clipped, x) * (adv != 0) * unclamped(t)  # d l_hat / d log r = 1
        grad = (w.sum(-1, keepdim=True) * s / n) * active * valid

        out = 1.0 - indicator(torch.eq, clipped, x)
        counts = {
            "clip/high_fraction": (out * indicator(torch.gt, adv, 0.0) * valid).sum(),
            "clip/low_fraction": (out * indicator(torch.lt, adv, 0.0) * valid).sum(),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        return (
            f"gmpo: s_i = exp(mean_t clip(log r_i,t)), log r clipped above at {self.eps_high:g} for A > 0 and below at "
            f"-{self.eps_low:g} for A < 0; l = -A s_i"
        )
