r"""Trainer/inference mismatch masks: IcePop, rejection sampling by k1/k2/k3, and the veto.

All read ``TokenBatch.rollout_logprobs`` (the inference engine's log-probabilities of the sampled
tokens) and compare them with ``old_logprobs`` (the trainer's, same weights) through

$$\log r_{i,t} = \mathrm{clamp}\bigl(\log\pi_{train}(y_{i,t}) - \log\pi_{infer}(y_{i,t}),\,-20,\,20\bigr)$$

(veRL's ``SAFETY_BOUND``). Sequence statistics run over each response's own tokens
(``response_mask``), whatever other masks do, so several of these masks compose as veRL ANDs its
``rollout_rs`` options.

``rejected`` — what happens to a rejected token, made explicit because the methods differ:

- ``padding``: the token stops counting as a response token at all. It leaves every denominator
  (``count: valid`` and ``count: kept``, tokens and responses), every quantile population and the
  regularisers, exactly as veRL's ``rollout_rs`` does by editing ``response_mask`` before the loss.
- ``masked``: the token is silenced like any masked token: it leaves ``count: kept`` denominators
  but stays in ``count: valid`` ones (the $1/\sum_i |y_i|$ of IcePop's objective, and veRL's IcePop,
  which zeroes the token's importance weight without touching ``response_mask``).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rlstab.lazy import torch
from rlstab.masks.base import Mask
from rlstab.tokens import Tokens

SAFETY_BOUND = 20.0
Rejected = Literal["padding", "masked"]


def rollout_log_ratio(t: Tokens) -> torch.Tensor:
    """``[B, T]`` clamped ``log pi_train(old) - log pi_infer``; 0 on padding (whatever the padding held)."""
    log_ratio = (t.old_logprobs - t.rollout_logprobs).clamp_(-SAFETY_BOUND, SAFETY_BOUND)
    return torch.where(t.batch.response_mask, log_ratio, 0.0)


class RolloutMask(Mask):
    """Base of the masks that read the inference engine's log-probabilities."""

    reads: ClassVar[frozenset[str]] = frozenset({"rollout_logprobs"})
    rejected: Rejected = "padding"
    """``padding``: rejected tokens leave every denominator (veRL's rollout_rs). ``masked``: silenced, still counted by ``count: valid``."""

    @property
    def acts_on_valid(self) -> bool:
        """Whether the compiled objective treats this mask's rejections as padding."""
        return self.rejected == "padding"


class IcePop(RolloutMask):
    r"""IcePop: silence tokens whose train/inference probability ratio leaves $[\alpha, \beta]$.

    $$\text{keep iff } \alpha \le k_{i,t} \le \beta,\qquad
      k_{i,t} = \frac{\pi_{train}(y_{i,t};\theta_{old})}{\pi_{infer}(y_{i,t};\theta_{old})}$$

    IcePop (Ling team, "Small Leak Can Sink a Great Ship — Boost RL Training on MoE with IcePop",
    2025; Ring-1T, arXiv 2510.18855) trains on
    $\frac{1}{\sum_i|y_i|}\sum_{i,t}\mathcal M(k_{i,t})\,J^{clip}_{i,t}$ with $\mathcal M(k) = k$
    inside the band and 0 outside: a mask *and* the importance weight $k$. This component is the
    mask; the ``icepop`` preset adds the weight with ``tis`` (token level, cap $\beta$, which
    leaves every kept token's $k \le \beta$ untouched). Defaults $\alpha = 0.5$, $\beta = 5$ (the
    blog's values and veRL's ``decoupled_token_icepop``). ``rejected: masked`` by default: masked
    tokens stay in the $1/\sum_i|y_i|$ denominator, as in IcePop's objective and veRL.

    The ratio is compared as veRL does: $k = \exp(\mathrm{clamp}(\log r, -20, 20))$ against the
    bounds, both inclusive. ``low: 0`` keeps every ratio up to $\beta$: TRL 1.16's ``token_mask``
    importance-sampling mode with its default ``vllm_importance_sampling_clip_min = None`` (see
    [`TruncatedIS`][rlstab.reweighters.TruncatedIS] for all four TRL modes).
    """

    kind: Literal["icepop"] = "icepop"
    low: float = Field(0.5, ge=0.0)
    """alpha: the lowest train/inference ratio kept (0: no lower bound)."""
    high: float = Field(5.0, gt=0.0)
    """beta: the highest train/inference ratio kept."""
    rejected: Rejected = "masked"
    """``masked`` (IcePop): silenced tokens still count in ``count: valid``; ``padding``: they leave every denominator."""

    @model_validator(mode="after")
    def _band(self):
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        k = rollout_log_ratio(t).exp_()
        return ((k >= self.low) & (k <= self.high)).to(torch.float32)

    def describe(self) -> str:
        return (
            f"icepop: keep iff {self.low:g} <= pi_train(old)/pi_infer <= {self.high:g}; "
            f"rejected tokens are {'padding (leave every denominator)' if self.acts_on_valid else 'masked'}"
        )


Level = Literal["token", "sequence_sum", "sequence_mean", "sequence_max"]
Divergence = Literal["k1", "k2", "k3", "binary_kl", "binary_kl_rollout"]
BINARY_KL_FLOOR = 1e-6
BINARY_KL_TERMS = "D_B(a || b) = a log(a/b) + (1-a) log((1-a)/(1-b)), p = pi_train(old)(y_t), q = pi_infer(y_t)"


def binary_kl(log_p: torch.Tensor, log_q: torch.Tensor, floor: float) -> torch.Tensor:
    """``D_B(p||q) = p log(p/q) + (1-p) log((1-p)/(1-q))`` of the Bernoulli {sampled token, the rest}, p and q clamped to ``[floor, 1 - floor]``.

    Computed from the log-probabilities, ``1 - p`` as ``-expm1(log p)``: in float32 ``1 - 1e-8``
    rounds to 1, so the direct formula gives ``0 * log(0 / 0)`` = NaN for a token of probability
    near 1 (and a comparison with NaN rejects it); here the clamp holds at any floor.
    """
    low, high = math.log(floor), math.log1p(-floor)
    log_p, log_q = log_p.clamp(low, high), log_q.clamp(low, high)
    log_rest_p, log_rest_q = torch.log(-torch.expm1(log_p)), torch.log(-torch.expm1(log_q))
    return log_p.exp() * (log_p - log_q) + (-torch.expm1(log_p)) * (log_rest_p - log_rest_q)


class RolloutRejection(RolloutMask):
    r"""Rejection sampling by the train/inference divergence of each token or sequence.

    Per token, with $\ell = \log r = \log\pi_{train}(old) - \log\pi_{infer}$ (clamped to $\pm 20$):

    - ``k1``: $\ell$ itself, kept iff $\log(\text{low}) \le \ell \le \log(\text{high})$: a band on
      the ratio $r$ (``low`` defaults to ``1/high``, veRL's reading of a single threshold);
    - ``k2``: $\tfrac12 \ell^2$, kept iff $\le$ ``high``;
    - ``k3``: $e^{\ell} - 1 - \ell$, kept iff $\le$ ``high``;
    - ``binary_kl`` (KPop): $\max\bigl(D_B(p\,\|\,q),\ D_B(q\,\|\,p)\bigr)$, kept iff $\le$ ``high`` ($\phi$), with
      $p = \pi_{train}(y_t;\theta_{old})$, $q = \pi_{infer}(y_t)$ and the binary KL of the Bernoulli
      {sampled token, every other token}
      $D_B(p\|q) = p\log\frac{p}{q} + (1-p)\log\frac{1-p}{1-q}$;
    - ``binary_kl_rollout``: $D_B(q\,\|\,p)$ alone, kept iff $\le$ ``high``: OpenRLHF 0.11.2's
      ``is_correction_gating: binary_kl`` (``openrlhf/models/loss.py``, ``PolicyLoss.forward``).

    Both binary-KL divergences clamp $p$ and $q$ to $[\epsilon, 1-\epsilon]$ first, so that a
    probability of 0 or 1 gives a finite divergence; the divergence is computed from the
    log-probabilities, $1-p$ as $-\mathrm{expm1}(\log p)$, so that the clamp holds in float32 (where
    $1 - 10^{-8}$ rounds to 1 and AReaL's direct formula gives NaN, rejecting every token of
    probability within $6\cdot10^{-8}$ of 1; rlstab keeps such a token when the two agree).
    ``binary_kl_floor`` $\epsilon$ is an option because the implementations differ: $10^{-6}$ (the
    default) in prime-rl's KPop loss
    (``src/prime_rl/trainer/rl/loss.py``, ``kpop_loss_fn``, branch ``feat/algo-ablations``) and
    OpenRLHF; $10^{-8}$ in AReaL's ``compute_binary_kl_divergence``
    (``areal/utils/functional/functional.py``). They differ only for probabilities within
    $10^{-6}$ of 0 or 1.

    KPop (Guo, Sun et al., Ant Group, "Taming Training-Inference Mismatch in Reinforcement
    Learning with Adaptive Masking Regions", 2026; ringtech.notion.site/kpop) is this test at
    ``token`` level: a band that is wide in ratio terms for rare tokens and tight for confident
    ones. It is veRL's ``rollout_rs: binary_kl`` (verl-project/verl PR #6800, not in a release
    yet) and AReaL's ``rejection_sampling.metric: binary_kl``; at ``sequence_*`` levels the
    per-token divergence is summed, averaged or maximised like k2 and k3 (OpenRLHF's
    ``is_correction_level: seq`` averages ``binary_kl_rollout``).

    ``level``: ``token`` tests each token; ``sequence_sum`` / ``sequence_mean`` test the sum / mean
    of the per-token statistic over the response and keep or reject the whole response
    (``sequence_sum`` with k1 bounds the sequence importance ratio $\prod_t r_t$, ``sequence_mean``
    its geometric mean); ``sequence_max`` rejects the whole response when any of its tokens fails
    the token test (for k2/k3 exactly veRL's max statistic; for k1, which veRL does not offer at
    this level, every token must lie inside the band).

    These are veRL 0.9.1's ``rollout_rs`` options (``verl/trainer/ppo/rollout_corr_helper.py``,
    ``compute_rollout_rejection_mask``): ``token_k*``, ``seq_sum_k*``, ``seq_mean_k*``,
    ``seq_max_k2/k3``, with the same statistics, comparisons (inclusive bounds) and clamp. veRL has
    no default threshold (``rollout_rs_threshold`` is required), so ``high`` is required here too;
    its presets use ``sequence_sum`` k1 with [0.5, 2] (``decoupled_seq_is_rs``), ``sequence_mean``
    k1 with [0.999, 1.001] (``decoupled_geo_rs``) and ``sequence_mean`` k3 with 0.01
    (``decoupled_k3_rs``). One deviation: veRL tests k1 as $-\ell \in [\log \text{low}, \log
    \text{high}]$, i.e. it bounds $1/r$; rlstab bounds $r$ as the docs of both describe. The two
    agree for symmetric bands (``low = 1/high``, veRL's single-number form and its [0.5, 2] preset).
    veRL's sequence mean divides by ``n + 1e-8``; rlstab by ``n``.

    TRL 1.16's ``sequence_mask`` importance-sampling mode is ``sequence_sum`` k1 with ``low`` =
    ``vllm_importance_sampling_clip_min`` (0 when None: no lower bound), ``high`` =
    ``vllm_importance_sampling_clip_max`` and ``rejected: masked`` (TRL zeroes the weight, the
    token stays in its denominators); its ``token_mask`` mode is ``token`` k1 the same way.

    ``rejected: padding`` (default, veRL): rejected tokens leave every denominator.
    """

    kind: Literal["rollout_rejection"] = "rollout_rejection"
    level: Level = "token"
    """Where the statistic is tested: each token, or the sum / mean / max over each response."""
    divergence: Divergence = "k1"
    """k1: log-ratio band; k2: 0.5 (log r)^2; k3: r - 1 - log r; binary_kl: KPop's max of both binary KLs; binary_kl_rollout: D_B(pi_infer || pi_train)."""
    high: float = Field(gt=0.0)
    """Upper bound: on the ratio (k1) or on the divergence (k2, k3, binary_kl). Required, as in veRL."""
    low: float | None = Field(None, ge=0.0)
    """k1 only: the lowest ratio kept; null means 1/high; 0: no lower bound (TRL's ``clip_min = None``)."""
    binary_kl_floor: float | None = Field(None, gt=0.0, lt=0.5)
    """binary_kl divergences only: probabilities are clamped to [floor, 1 - floor]; null means 1e-6 (prime-rl, OpenRLHF)."""
    _later_fields: ClassVar[tuple[str, ...]] = ("binary_kl_floor",)

    @model_validator(mode="after")
    def _bounds(self):
        if self.divergence != "k1" and self.low is not None:
            raise ValueError(f"low applies to k1 only; {self.divergence} has an upper bound only")
        if self.divergence == "k1" and self.low is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.binary_kl_floor is not None and not self.divergence.startswith("binary_kl"):
            raise ValueError(f"binary_kl_floor applies to the binary_kl divergences only, not {self.divergence}")
        return self

    def _band(self) -> tuple[float, float]:
        low = 1.0 / self.high if self.low is None else self.low
        return (math.log(low) if low > 0 else -math.inf), math.log(self.high)

    def _statistic(self, t: Tokens) -> torch.Tensor:
        """The per-token statistic, 0 on padding."""
        if self.divergence.startswith("binary_kl"):
            floor = BINARY_KL_FLOOR if self.binary_kl_floor is None else self.binary_kl_floor
            train, infer = t.old_logprobs, t.rollout_logprobs
            stat = binary_kl(infer, train, floor)
            if self.divergence == "binary_kl":
                stat = torch.maximum(stat, binary_kl(train, infer, floor))
            # where, not a multiply: padding may hold anything (inf * 0 is NaN)
            return torch.where(t.batch.response_mask, stat, 0.0)
        log_ratio = rollout_log_ratio(t)
        if self.divergence == "k1":
            return log_ratio
        if self.divergence == "k2":
            return log_ratio.square().mul_(0.5)
        return log_ratio.exp().sub_(1.0).sub_(log_ratio)

    def _passes(self, stat: torch.Tensor) -> torch.Tensor:
        if self.divergence == "k1":
            low, high = self._band()
            return (stat >= low) & (stat <= high)
        return stat <= self.high

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        response = t.batch.response_mask
        stat = self._statistic(t)  # 0 on padding
        if self.level == "token":
            return self._passes(stat).to(torch.float32)
        if self.level == "sequence_max":
            ok = (self._passes(stat) | ~response).all(-1, keepdim=True)
        else:
            total = stat.sum(-1, keepdim=True)
            if self.level == "sequence_mean":
                total = total / response.sum(-1, keepdim=True).clamp(min=1)
            ok = self._passes(total)
        return ok.to(torch.float32).expand_as(t.logprobs)

    def describe(self) -> str:
        if self.divergence == "k1":
            low = 1.0 / self.high if self.low is None else self.low
            test = f"in [{low:g}, {self.high:g}]"
            stat = {"token": "r", "sequence_sum": "prod_t r", "sequence_mean": "exp(mean_t log r)", "sequence_max": "r"}
        else:
            test = f"<= {self.high:g}"
            k = {"k2": "0.5 (log r)^2", "k3": "r - 1 - log r", "binary_kl_rollout": "D_B(q || p)",
                 "binary_kl": "max(D_B(p || q), D_B(q || p))"}[self.divergence]
            stat = {"token": k, "sequence_sum": f"sum_t {k}", "sequence_mean": f"mean_t {k}", "sequence_max": k}
        subject = "every token of the response has" if self.level == "sequence_max" else (
            "the token has" if self.level == "token" else "the response has")
        fate = "padding (leave every denominator)" if self.acts_on_valid else "masked"
        floor = self.binary_kl_floor or BINARY_KL_FLOOR
        defined = (f"{BINARY_KL_TERMS}, both clamped to [{floor:g}, 1 - {floor:g}]"
                   if self.divergence.startswith("binary_kl") else "r = pi_train(old)/pi_infer")
        return (
            f"rollout_rejection ({self.divergence}, {self.level}): keep iff {subject} {stat[self.level]} {test}, "
            f"{defined}; rejected tokens are {fate}"
        )


class RolloutVeto(RolloutMask):
    r"""The veto: reject a whole response if any of its tokens has a catastrophically small ratio.

    $$\text{reject response } i \text{ iff } \exists t:\ \frac{\pi_{train}(y_{i,t};\theta_{old})}
      {\pi_{infer}(y_{i,t};\theta_{old})} < \tau$$

    A token the trainer finds far less likely than the sampler did signals a sampler/trainer bug or
    numerical failure, and one such token makes the whole response untrustworthy. veRL's
    rollout correction had it as ``rollout_token_veto_threshold`` (its 0.9.1 ``bypass_mode`` still
    names "RS + veto" but the option is gone); the DR.Kernel recipe keeps it with $\tau = 10^{-4}$,
    the default here. The test is strict, in log space: $\log r < \log \tau$.
    ``rejected: padding`` (default): the vetoed response leaves every denominator.
    """

    kind: Literal["rollout_veto"] = "rollout_veto"
    threshold: float = Field(1e-4, gt=0.0, lt=1.0)
    """tau: a token whose ratio is below it vetoes its response."""

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        bad = (rollout_log_ratio(t) < math.log(self.threshold)) & t.batch.response_mask
        return (~bad.any(-1, keepdim=True)).to(torch.float32).expand_as(t.logprobs)

    def describe(self) -> str:
        fate = "padding (leave every denominator)" if self.acts_on_valid else "masked"
        return f"rollout_veto: reject a response if any token has pi_train(old)/pi_infer < {self.threshold:g}; rejected tokens are {fate}"
