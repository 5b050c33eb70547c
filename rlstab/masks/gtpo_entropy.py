r"""GTPO's entropy filter: drop every response whose mean token entropy exceeds a bound."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.advantages.gtpo import mean_entropy
from rlstab.lazy import torch
from rlstab.masks.base import Mask
from rlstab.tokens import Tokens


class GTPOEntropyFilter(Mask):
    r"""Silence every token of a response whose mean token entropy exceeds a bound (GTPO, arXiv 2508.03772).

    $$M_{i,t} = \delta_i = \mathbb{1}\big[\langle H\rangle_i \le \bar H\big],\qquad
    \langle H\rangle_i = \frac{1}{|o_i|}\sum_{t=1}^{|o_i|} H_{i,t}$$

    with $H_{i,t}$ the entropy of the policy's next-token distribution (``TokenBatch.entropy``) averaged over
    the response's valid tokens. It is the factor $\delta_i$ of the objective the authors state (README of
    github winstonsmith1897/GTPO): high-entropy completions are filtered out to prevent policy collapse.

    ``bound`` ($\bar H$): $\ln 2 \approx 0.693$, the threshold of the authors' $\delta_i$ (README; the paper's
    "provable threshold"). Their code (``gtpo/gtpo_training.py``, ``ENT_THRESHOLD``) uses 0.7 by default and
    keeps a response iff its mean entropy is at most the bound (``low_ent = entropies <= ENT_THRESHOLD``),
    as here. The authors' $\delta_i$ applies the filter only when the initial policy's mean entropy
    $\langle H\rangle_{ini}$ is below $\ln 2$ (a model that starts above it trains unfiltered, $\delta_i = 1$);
    their Colab sets the bound to 777 (no filter) for Qwen and notes 0.69 as the value for LLaMA. rlstab
    does not measure $\langle H\rangle_{ini}$: leave this mask out of the objective for a model that starts
    above the bound.

    Silenced tokens stay in ``count: valid`` denominators: $\delta_i$ multiplies the response's term inside
    the authors' $\frac{1}{G}\sum_i \frac{1}{|o_i|}\sum_t$ (their code sets the response's advantage to 0
    and still divides by G and $|o_i|$). Which entropy: whatever the trainer passes; the authors' is the
    current policy's on their single update per rollout (``compute_completion_stats``, on the new logits).

    Scope: the statistic is per response, and a response lies whole in one micro-batch, so the mask is the
    same at any micro-batch size and number of ranks (no step statistic). An empty response has mean 0
    and is kept.

    Metrics: ``mask/gtpo_entropy_filter/kept`` (fraction of valid tokens kept).
    """

    kind: Literal["gtpo_entropy_filter"] = "gtpo_entropy_filter"
    bound: float = Field(0.6931471805599453, ge=0.0)
    """The largest mean token entropy a response may have and still train (the paper's ln 2)."""

    reads: ClassVar[frozenset[str]] = frozenset({"entropy"})

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        kept = mean_entropy(t.entropy, t.valid_bool) <= self.bound
        return kept.to(torch.float32).unsqueeze(-1).expand_as(t.logprobs)

    def describe(self) -> str:
        return (
            f"gtpo_entropy_filter: silence response i iff its mean token entropy <H>_i > {self.bound:g} "
            "(silenced tokens stay in count: valid)"
        )
