"""VESPO: a smooth Gamma-shaped kernel on the sequence-level importance weight, as a surrogate."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator
from rlstab.clipping import Surrogate, SurrogateResult
from rlstab.lazy import torch  # imported at its first use: validating an objective needs no torch
from rlstab.tokens import Tokens

LOG_W_MIN = math.log(1e-8)
"""Lower clamp of log W (and of each token's log rollout ratio): the authors' ``w.clamp(min=1e-8)``, TRL's."""
LOG_W_MAX = 20.0
"""Upper clamp of log W (and of each token's log rollout ratio), as the authors and TRL."""
LOW_PHI = 0.5
"""Threshold of the ``vespo/phi_below_half_fraction`` metric."""


class VESPO(Surrogate):
    r"""Variational sEquence-level Soft Policy Optimization (VESPO; Shen et al., arXiv 2602.10693).

    Every token of response $i$ is trained with the REINFORCE gradient scaled by one detached
    coefficient, a Gamma-shaped kernel of the response's *sequence-level* importance weight
    $W_i = \pi_\theta(y_i)/\mu(y_i)$, the product of its token ratios (a sum in log space, with
    no length normalisation, unlike GSPO's geometric mean):

    $$\log W_i = \mathrm{clip}\Bigl(\sum_{t} \log r_{i,t},\ \log 10^{-8},\ 20\Bigr), \qquad
    \phi(W) = W^{k}\, e^{\lambda (1 - W)}, \qquad
    (k, \lambda) = \begin{cases}(k_{pos}, \lambda_{pos}) & A \ge 0\\ (k_{neg}, \lambda_{neg}) & A < 0\end{cases}$$

    $$l_{i,t} = -\,\mathrm{sg}\bigl[\phi(W_i)\bigr]\, A_{i,t}\, \log\pi_\theta(y_{i,t}), \qquad
    \frac{\partial l_{i,t}}{\partial \log\pi_\theta(y_{i,t})} = -\phi(W_i)\, A_{i,t}$$

    $\phi(1) = 1$, so on-policy data trains exactly as REINFORCE/GRPO; $W^k$ fades responses the
    current policy has made unlikely, $e^{-\lambda W}$ responses it has made much likelier, and
    both smoothly (no clip boundary). The paper reads any reshaping $\phi$ as a change of proposal
    distribution, derives the closed-form kernel $\phi(W) \propto W^{k} e^{-\lambda W}$ from a
    proposal that balances proximity to the behaviour policy $\mu$ and to $\pi_\theta$ under a
    variance constraint, and deploys it normalised to $\phi(1) = 1$ with separate parameters for
    positive and negative advantages; its gradient estimator is
    $\mathbb{E}_{\tau\sim\mu}[\phi(W(\tau))\,A(\tau)\,\nabla_\theta\log\pi_\theta(\tau)]$.

    **The value is not a ratio surrogate.** The loss *value* is that of the formula above (it
    contains $\log\pi$, not a function of $r$), exactly as TRL 1.16's ``loss_type="vespo"`` and
    the authors' veRL recipe compute it, so a numerical comparison with them holds; only its
    gradient is the paper's. The gradient flows through $\log\pi$ itself, so a token whose
    log-ratio was clamped still trains, with weight $\phi(W_i)$.

    **Inputs and clamps.** $\log r$ is the objective's clamped log-ratio ($\pm$
    ``log_ratio_clamp``, 20 by default, the authors' and TRL's per-token clamp). $\log W_i$ sums
    the valid tokens of response $i$ only (whatever the padding holds) and is clamped to
    $[\log 10^{-8}, 20]$ as in the authors' code and TRL's ``get_gamma_weights``; $\phi$ is
    computed in log space, $\log\phi = \lambda + k\log W - \lambda W$, and a non-finite $\phi$
    becomes 0 as theirs (float32 overflows only for extreme $k/\lambda$). The advantage selects
    $(k, \lambda)$ per token, so per-token advantages of mixed sign get per-token coefficients
    (as TRL, which broadcasts the sign test over ``[B, T]``); $A = 0$ takes the positive pair.

    **Rollout correction** (``rollout_correction``, default off). With it, each token's
    $\log(\pi_{old}/\pi_{rollout})$ (``old_logprobs - rollout_logprobs``, optionally capped at
    $\log$ ``rollout_cap``, then clamped to $[\log 10^{-8}, 20]$) is added to $\log W_i$
    before its clamp, so $W_i = \pi_\theta(y_i)/\pi_{rollout}(y_i)$: the ratio to the policy
    that actually sampled the response, which is what the paper's $W = \pi_\theta/\mu$ means
    when the inference engine's probabilities differ from the trainer's. The paper does not say
    whether a trainer's recomputed old log-probabilities or the engine's are $\mu$ in practice:
    the authors' code folds the ratio in only when the trainer hands it rollout IS weights
    (their fully asynchronous runs instead take the engine's log-probabilities as the old
    ones), and TRL folds its vLLM IS ratio (``token_truncate``: capped at
    ``vllm_importance_sampling_clip_max = 3``) whenever that correction is on. It is off by
    default because it needs ``rollout_logprobs``, which most batches do not carry, and because
    rlstab corrects the mismatch with components of their own (``tis``, ``icepop``): turning
    it on beside one of them would correct twice.

    **Defaults and their source.** $k_{pos} = 2$, $\lambda_{pos} = 3$, $k_{neg} = 3$,
    $\lambda_{neg} = 2$: the values of the authors' released code and training scripts
    (github.com/FloyedShen/VESPO, ``recipe/vespo``: ``K_POS=2.0 LAMBDA_POS=3.0 K_NEG=3.0
    LAMBDA_NEG=2.0``) and TRL 1.16's ``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``,
    ``vespo_lambda_neg``. The authors' scripts aggregate with veRL's ``token-mean`` and TRL's
    ``vespo`` divides by the generation batch's tokens: ``aggregation: {kind: token-mean,
    count: valid}``.

    Metrics: ``vespo/phi_mean``, the mean of $\phi(W_i)$ over valid tokens (how much of the
    plain policy gradient passes, 1 on-policy; TRL's ``vespo/phi_seq_mean`` averages over
    responses instead), and ``vespo/phi_below_half_fraction``, the fraction of valid tokens
    whose response has $\phi < 0.5$ (they train with less than half the REINFORCE gradient).
    """

    kind: Literal["vespo"] = "vespo"
    k_pos: float = Field(2.0, ge=0.0, le=100.0)
    """Power k of W for responses with A >= 0: fades W < 1 (authors' code and TRL: 2.0)."""
    lambda_pos: float = Field(3.0, ge=1e-4, le=100.0)
    """Decay rate lambda for responses with A >= 0: fades W > 1 (authors' code and TRL: 3.0)."""
    k_neg: float = Field(3.0, ge=0.0, le=100.0)
    """Power k of W for responses with A < 0 (authors' code and TRL: 3.0)."""
    lambda_neg: float = Field(2.0, ge=1e-4, le=100.0)
    """Decay rate lambda for responses with A < 0 (authors' code and TRL: 2.0)."""
    rollout_correction: bool = False
    """Fold each token's pi_old / pi_rollout into W (reads rollout_logprobs); off: W = pi_theta / pi_old."""
    rollout_cap: float | None = Field(None, gt=0.0, le=1e6)
    """With rollout_correction: cap each token's pi_old / pi_rollout at this value first (TRL: 3.0); null: no cap."""

    @model_validator(mode="after")
    def _cap_needs_correction(self):
        if self.rollout_cap is not None and not self.rollout_correction:
            raise ValueError("rollout_cap caps the rollout ratio, which rollout_correction: false leaves out")
        return self

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.rollout_correction else frozenset()

    def log_weights(self, t: Tokens) -> torch.Tensor:
        """``[B, 1]``: each response's clamped ``log W`` over its valid tokens."""
        valid = t.valid_bool
        # where, not a multiply by valid: padding may hold NaN or inf (NaN * 0 is NaN)
        log_w = torch.where(valid, t.log_ratio, 0.0).sum(-1, keepdim=True)
        if self.rollout_correction:
            log_is = t.old_logprobs - t.rollout_logprobs
            if self.rollout_cap is not None:
                log_is = log_is.clamp(max=math.log(self.rollout_cap))
            log_is = log_is.clamp(LOG_W_MIN, LOG_W_MAX)
            log_w = log_w + torch.where(valid, log_is, 0.0).sum(-1, keepdim=True)
        return log_w.clamp_(LOG_W_MIN, LOG_W_MAX)

    def phi(self, log_w: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        """The kernel from ``log W`` ``[B, 1]`` and the advantages ``[B, 1]`` or ``[B, T]`` (sign picks k, lambda)."""
        nonneg = adv >= 0
        k = torch.where(nonneg, self.k_pos, self.k_neg)
        lam = torch.where(nonneg, self.lambda_pos, self.lambda_neg)
        log_phi = lam + k * log_w - lam * torch.exp(log_w)
        return torch.exp(log_phi).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        adv, valid = t.advantage_rows, t.valid_bool
        phi = self.phi(self.log_weights(t), adv)  # [B, 1], or [B, T] with per-token advantages
        # where: padding may hold NaN or inf in the advantages or log-probabilities
        grad = torch.where(valid, (weight * adv.neg()) * phi, 0.0)
        per_token = torch.where(valid, phi.neg() * adv * t.logprobs, 0.0)  # TRL's -phi * A * logp
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))
        counts = {
            "vespo/phi_mean": (t.valid * phi).sum(),
            "vespo/phi_below_half_fraction": (t.valid * (phi < LOW_PHI)).sum(),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        w = "W = exp(clamp(sum_t log r, log 1e-8, 20))"
        if self.rollout_correction:
            cap = "" if self.rollout_cap is None else f", each capped at {self.rollout_cap:g}"
            w = "W = exp(clamp(sum_t log r + sum_t log(pi_old/pi_rollout)" + cap + ", log 1e-8, 20))"
        return (
            f"vespo: phi = W^k exp(lambda (1 - W)), {w}, (k, lambda) = ({self.k_pos:g}, {self.lambda_pos:g}) "
            f"if A >= 0 else ({self.k_neg:g}, {self.lambda_neg:g}); l = -sg(phi) A log p (gradient only through log p)"
        )
