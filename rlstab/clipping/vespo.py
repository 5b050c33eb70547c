"""VESPO: a smooth Gamma-shaped kernel on the sequence-level importance weight, as a surrogate."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.lazy import torch
from rlstab.tokens import Tokens


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
    contains $\log\pi$, not a function of $r$), exactly as TRL 1.16's ``loss_type="vespo"``
    (``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``:
    ``per_token_loss = -phi_seq * advantages * per_token_logps``) and the authors' veRL recipe
    compute it, so a numerical comparison with them holds; only its gradient is the paper's. The
    gradient flows through $\log\pi$ itself, so a token whose log-ratio was clamped still trains,
    with weight $\phi(W_i)$.

    **Inputs and clamps** (TRL 1.16, ``GRPOTrainer.get_gamma_weights``). $\log r$ is the
    objective's clamped log-ratio ($\pm$ ``log_ratio_clamp``, 20 by default: TRL's
    ``torch.clamp(log_ratio_per_token, -20.0, 20.0)``). $\log W_i$ sums the valid tokens of
    response $i$ only (whatever the padding holds) and is clamped to $[\log 10^{-8}, 20]$ (TRL's
    ``lower_clamp = math.log(1e-8)``, the authors' ``w.clamp(min=1e-8)``); $\phi$ is computed in
    log space, $\log\phi = \lambda + k\log W - \lambda W$, and a non-finite $\phi$ becomes 0, as
    TRL's ``nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)`` (float32 overflows only for extreme
    $k/\lambda$). The advantage selects $(k, \lambda)$ per token, so per-token advantages of mixed
    sign get per-token coefficients (TRL broadcasts ``advantages >= 0`` over ``[B, T]``);
    $A = 0$ takes the positive pair. TRL clamps $\lambda$ at $10^{-4}$ from below; here
    $\lambda < 10^{-4}$ is refused instead.

    **Rollout correction** (``rollout_correction``, default off). With it, each valid token's
    $\log(\pi_{old}/\pi_{rollout})$ (``old_logprobs - rollout_logprobs``; NaN counts as 0, TRL's
    ``nan_to_num`` for a token vLLM could not score) is bounded to the band
    [``rollout_floor``, ``rollout_cap``] (in ratio terms), clamped to $[\log 10^{-8}, 20]$ and
    added to $\log W_i$ before its clamp, so $W_i = \pi_\theta(y_i)/\pi_{rollout}(y_i)$: the
    ratio to the policy that actually sampled the response, which is what the paper's
    $W = \pi_\theta/\mu$ means when the inference engine's probabilities differ from the
    trainer's. ``rollout_bounds`` says what the band does: ``truncate`` clamps the ratio into it
    (TRL's ``vllm_importance_sampling_mode="token_truncate"``, clip_min/clip_max), ``mask`` sets a
    ratio outside it to 0, which the $\log 10^{-8}$ clamp turns into a factor $10^{-8}$ on $W_i$
    (TRL's ``token_mask``: its zeroed ratio reaches ``get_gamma_weights``, whose
    ``torch.log`` then ``clamp`` does exactly this; with $k > 0$ such a response practically
    stops training). TRL refuses its sequence-level modes with ``vespo``. The paper does not say
    whether a trainer's recomputed old log-probabilities or the engine's are $\mu$ in practice:
    the authors' code folds the ratio in only when the trainer hands it rollout IS weights, and
    TRL folds its vLLM IS ratio whenever that correction is on (TRL's default
    ``vllm_importance_sampling_mode``, ``sequence_mask``, is refused with ``vespo``, so a TRL run
    with vLLM sets ``token_truncate`` or ``token_mask``). It is off by default because it needs
    ``rollout_logprobs``, which most batches do not carry (TRL without vLLM folds nothing), and
    because rlstab corrects the mismatch with components of their own (``tis``, ``icepop``):
    turning it on beside one of them would correct twice. The band must contain 1
    (``rollout_floor <= 1 <= rollout_cap``): TRL's ratio is 1 on padding and its sum runs over
    every position, so only such a band leaves padding out of $W$ in both.

    **Defaults and their source.** $k_{pos} = 2$, $\lambda_{pos} = 3$, $k_{neg} = 3$,
    $\lambda_{neg} = 2$: TRL 1.16's ``GRPOConfig.vespo_k_pos``, ``vespo_lambda_pos``,
    ``vespo_k_neg``, ``vespo_lambda_neg`` (``trl/trainer/grpo_config.py``) and the defaults of
    ``get_gamma_weights``, the same values as the authors' released code and training scripts
    (github.com/FloyedShen/VESPO, ``recipe/vespo``). TRL's ``vespo`` divides the token sum by the
    generation batch's valid tokens (the ``dapo`` normaliser) and the authors' scripts use veRL's
    ``token-mean``: ``aggregation: {kind: token-mean, count: valid}`` (the ``vespo`` preset).

    Metrics: ``vespo/phi_mean``, the mean of $\phi(W_i)$ over valid tokens (how much of the
    plain policy gradient passes, 1 on-policy; TRL's ``vespo/phi_seq_mean`` averages over
    responses instead), and ``vespo/phi_below_half_fraction``, the fraction of valid tokens
    whose response has $\phi < 0.5$ (they train with less than half the REINFORCE gradient).
    """

    kind: Literal["vespo"] = "vespo"
    k_pos: float = Field(2.0, ge=0.0, le=100.0)
    """Power k of W for responses with A >= 0: fades W < 1 (TRL vespo_k_pos: 2.0)."""
    lambda_pos: float = Field(3.0, ge=1e-4, le=100.0)
    """Decay rate lambda for responses with A >= 0: fades W > 1 (TRL vespo_lambda_pos: 3.0)."""
    k_neg: float = Field(3.0, ge=0.0, le=100.0)
    """Power k of W for responses with A < 0 (TRL vespo_k_neg: 3.0)."""
    lambda_neg: float = Field(2.0, ge=1e-4, le=100.0)
    """Decay rate lambda for responses with A < 0 (TRL vespo_lambda_neg: 2.0)."""
    rollout_correction: bool = False
    """Fold each token's pi_old / pi_rollout into W (reads rollout_logprobs); off: W = pi_theta / pi_old."""
    rollout_cap: float | None = Field(None, ge=1.0, le=1e6)
    """With rollout_correction: the upper end of each token's pi_old / pi_rollout band (TRL clip_max: 3.0); null: none."""
    rollout_floor: float | None = Field(None, gt=0.0, le=1.0)
    """With rollout_correction: the lower end of the band (TRL vllm_importance_sampling_clip_min); null: none."""
    rollout_bounds: Literal["truncate", "mask"] = "truncate"
    """With a band: truncate clamps a ratio into it (TRL token_truncate); mask makes a ratio outside it 1e-8 (TRL token_mask)."""

    _LOG_W_MIN: ClassVar[float] = math.log(1e-8)
    _LOG_W_MAX: ClassVar[float] = 20.0
    _LOW_PHI: ClassVar[float] = 0.5  # threshold of vespo/phi_below_half_fraction

    @model_validator(mode="after")
    def _band_needs_correction(self):
        band = self.rollout_cap is not None or self.rollout_floor is not None
        if band and not self.rollout_correction:
            raise ValueError(
                "rollout_cap / rollout_floor bound the rollout ratio, which rollout_correction: false leaves out"
            )
        if self.rollout_bounds == "mask" and not band:
            raise ValueError("rollout_bounds: mask needs a band (rollout_cap and/or rollout_floor)")
        return self

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.rollout_correction else frozenset()

    def _log_rollout_ratio(self, t: Tokens) -> torch.Tensor:
        """``[B, T]``: each token's bounded, clamped ``log(pi_old / pi_rollout)`` (padding: anything)."""
        log_is = torch.nan_to_num(t.old_logprobs - t.rollout_logprobs, nan=0.0)
        low = -math.inf if self.rollout_floor is None else math.log(self.rollout_floor)
        high = math.inf if self.rollout_cap is None else math.log(self.rollout_cap)
        if self.rollout_bounds == "truncate":
            log_is = log_is.clamp(min=low, max=high)
        else:
            log_is = torch.where((log_is < low) | (log_is > high), self._LOG_W_MIN, log_is)
        return log_is.clamp(self._LOG_W_MIN, self._LOG_W_MAX)

    def log_weights(self, t: Tokens) -> torch.Tensor:
        """``[B, 1]``: each response's clamped ``log W`` over its valid tokens."""
        valid = t.valid_bool
        # where, not a multiply by valid: padding may hold NaN or inf (NaN * 0 is NaN)
        log_w = torch.where(valid, t.log_ratio, 0.0).sum(-1, keepdim=True)
        if self.rollout_correction:
            log_w = log_w + torch.where(valid, self._log_rollout_ratio(t), 0.0).sum(-1, keepdim=True)
        return log_w.clamp_(self._LOG_W_MIN, self._LOG_W_MAX)

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
            "vespo/phi_below_half_fraction": (t.valid * (phi < self._LOW_PHI)).sum(),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        w = "W = exp(clamp(sum_t log r, log 1e-8, 20))"
        if self.rollout_correction:
            band = ""
            if self.rollout_cap is not None or self.rollout_floor is not None:
                low = "0" if self.rollout_floor is None else f"{self.rollout_floor:g}"
                high = "inf" if self.rollout_cap is None else f"{self.rollout_cap:g}"
                how = "clamped to" if self.rollout_bounds == "truncate" else "1e-8 outside"
                band = f", each {how} [{low}, {high}]"
            w = "W = exp(clamp(sum_t log r + sum_t log(pi_old/pi_rollout)" + band + ", log 1e-8, 20))"
        return (
            f"vespo: phi = W^k exp(lambda (1 - W)), {w}, (k, lambda) = ({self.k_pos:g}, {self.lambda_pos:g}) "
            f"if A >= 0 else ({self.k_neg:g}, {self.lambda_neg:g}); l = -sg(phi) A log p (gradient only through log p)"
        )
