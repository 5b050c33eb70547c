"""MaxRL: the group-centred reward divided by the group's mean reward (maximum-likelihood RL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.deferred import require
from rlstab.lazy import torch


@dataclass(frozen=True)
class MaxRLState:
    """A step's group table and its metrics (0-d tensors: computed without reading the device)."""

    table: GroupTable
    metrics: dict[str, torch.Tensor]


class MaxRL(AdvantageEstimator):
    r"""Maximum Likelihood Reinforcement Learning (Tajwar, Zeng et al., arXiv 2602.02710).

    $$A_i = \frac{1}{s_g}\cdot\begin{cases}0, & \hat\mu_g = 0\\[2pt]
      \dfrac{R_i - \hat\mu_g}{\hat\mu_g + \varepsilon}, & \text{otherwise}\end{cases}
      \qquad s_g = n_g \text{ (}\texttt{divide\_by\_group\_size}\text{) or } 1$$

    over the $n_g$ responses of the prompt's group $g$, $\hat\mu_g$ their mean reward. With binary
    rewards the model's pass rate $p(x)$ is an implicit likelihood; RL on expected reward
    maximises $\mathbb E_x\,p(x)$, the first term of the Maclaurin expansion of the maximum
    likelihood objective $\mathbb E_x \log p(x) = -\mathbb E_x\sum_k \mathrm{fail@}k(x)/k$. Averaging
    score functions over the $K$ *successful* rollouts instead of all $N$ (eq. ``cond-est``;
    equations are named by their labels in the paper's source, ``paper.tex`` of github
    Zanette-Labs/MaxRL, commit f98fca2) is unbiased for the truncation of order $T = N$, $\sum_{k=1}^{N}\frac1k\nabla\mathrm{pass@}k$
    (its theorem "estimator--objective equivalence"); subtracting the zero-mean control variate
    $\frac1N\sum_i S_i$ gives $\sum_i (r_i/K - 1/N) S_i = \sum_i \frac{1}{N}\frac{r_i-\hat\mu}{\hat\mu} S_i$
    (eq. ``final-estimator``), the formula above with $s_g = N$. Prompts with no success
    ($\hat\mu_g = 0$) get no gradient ("we drop both terms when K = 0"). Hard prompts weigh like
    $1/p$: GRPO's $1/\mathrm{std}$ lies between RL and this.

    **Choices and where they come from.** The authors' code (github Zanette-Labs/MaxRL, commit
    76e04d1, ``verl/trainer/ppo/core_algos.py`` ``compute_p_normalization_outcome_advantage``,
    line 393-442, the estimator ``p_normalization`` their ``math/smollm.sh`` line 13 trains with; the
    snapshot's ``ray_trainer.py`` line 269-279 dispatches that name to a
    ``compute_maxrl_outcome_advantage`` which its ``core_algos.py`` does not define, so the
    registered function is the one this follows):

    - ``eps = 1e-6``: line 432 divides by ``mean + epsilon`` (line 398: ``epsilon = 1e-6``), and
      line 428-429 set A = 0 when the mean is exactly 0;
    - ``divide_by_group_size = true``: line 440 divides every advantage by N, the number of
      rollouts per prompt, as eq. ``final-estimator`` does. The paper's Algorithm 1 and prime-rl's
      ``max_rl`` (PrimeIntellect-ai/prime-rl, ``src/prime_rl/orchestrator/algo/max_rl.py``
      ``score_group``) leave it out; false reproduces them. It is a constant per step when every
      prompt has the same number of rollouts, so under Adam it changes little, but it sets the
      policy gradient's size against a KL or entropy term. The authors' N is the first group's
      size (line 413) for every group; here each group's own $n_g$ (responses with a response
      token), the same when groups are equal, and the estimator's $N$ when they are not;
    - a group of one response gets A = 0 (line 416-418 set its mean to 0; prime-rl's
      ``(r - mean) / mean`` is 0 too);
    - rewards must not be negative: the theory is for binary success, prime-rl "assumes
      non-negative (canonically binary) rewards", and a negative group mean would flip every
      advantage's sign; a negative or non-finite reward of a response is an error. A group
      whose mean is 0 (every response failed) carries no gradient.

    **Sampling.** None beyond what every trainer does: the truncation order is the number of
    rollouts per prompt (the group size: veRL's ``rollout.n``, TRL's ``num_generations``).
    The paper (section "Practical MaxRL implementation") says MaxRL is "a single line change in
    the advantage calculation"; for its Qwen3 runs the authors "do not use special sampling
    techniques" and "do not use any adaptive sampling" (appendix, hyper-parameters); the authors' ``math/smollm.sh`` sets
    only ``rollout.n=128``. So MaxRL declares no ``sampler:``; ``step_metrics`` report the order.

    Not implemented: the authors' code also holds Maclaurin estimators of a lower truncation order
    $T < N$ (``maclaurin.py``, ``compute_maclaurin_outcome_advantage``); the paper's MaxRL is
    $T = N$.

    Metrics: ``truncation_order`` (mean responses per group, over the groups with a response) and
    ``no_success_fraction`` (groups of two or more responses that all failed: no gradient).
    """

    kind: Literal["maxrl"] = "maxrl"
    eps: float = Field(1e-6, ge=0.0, le=1.0)
    """Added to the group's mean reward in the denominator (the authors' 1e-6)."""
    divide_by_group_size: bool = True
    """Divide by the group's number of responses N (the authors' code, eq. final-estimator); false: Algorithm 1, prime-rl."""

    def fit(self, rewards, group_ids, lengths, responses=None) -> MaxRLState:
        real = rewards.to(torch.float32) if responses is None else torch.where(responses, rewards.to(torch.float32), 0.0)
        usable = (real >= 0) & torch.isfinite(real)  # NaN fails both

        def unusable() -> ValueError:
            bad = real[~usable].tolist()[:5]
            return ValueError(
                f"maxrl: rewards must be finite and not negative (MaxRL's rewards are binary success, 0 or 1), got {bad}"
            )

        require(usable.all(), unusable)
        table = GroupTable.fit(rewards, group_ids, responses)
        sized = table.count > 0  # groups with a response (a group of padding rows only has count 0)
        several = table.count > 1  # a group of one has mean 0 by convention, whatever its reward
        metrics = {
            "truncation_order": table.count.sum() / sized.sum().clamp(min=1),
            "no_success_fraction": ((table.mean <= 0) & several).sum() / several.sum().clamp(min=1),
        }
        return MaxRLState(table=table, metrics=metrics)

    def step_metrics(self, stats: MaxRLState) -> dict[str, torch.Tensor]:
        return stats.metrics

    def apply(self, stats: MaxRLState, rewards, group_ids, responses=None):
        mean, _, n = stats.table.rows(group_ids, responses)
        centred = (rewards.to(torch.float32) - mean) / (mean + self.eps)
        if self.divide_by_group_size:
            centred = centred / n.clamp(min=1.0)
        # mean 0: every response of the group failed (or a group of one): no gradient, as the authors' code
        return zero_padding_rows(torch.where(mean > 0, centred, 0.0), responses)

    def describe(self) -> str:
        scale = " / n_g" if self.divide_by_group_size else ""
        return (
            f"maxrl: A_i = (R_i - mean_g R) / (mean_g R + {self.eps:g}){scale}, 0 when mean_g R = 0; "
            "g = the prompt's group of n_g responses (rewards >= 0, binary success)"
        )
