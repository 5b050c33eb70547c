"""REINFORCE: the plain policy gradient -A log p, optionally weighted by a detached, truncated ratio."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator
from rlstab.lazy import torch
from rlstab.tokens import Tokens

SAFETY_BOUND = 20.0
"""The log-ratio clamp before ``exp`` of the importance weight (veRL's ``SAFETY_BOUND``)."""


class Reinforce(Surrogate):
    r"""REINFORCE (Williams, 1992): no ratio in the loss, the advantage times the log-probability.

    $$l = -\,w\,A\,\log\pi_\theta(y_t), \qquad \frac{\partial l}{\partial \log\pi} = -w\,A$$

    with $w = 1$ (``is_weight: none``), or a detached importance weight of the policy ratio
    $r = \pi_\theta / \pi_{old}$ truncated at $C$ (``is_cap``):

    - ``token``: $w_{i,t} = \min\bigl(\exp(\mathrm{clamp}(\log r_{i,t}, \pm 20)),\ C\bigr)$;
    - ``sequence``: $w_i = \min\bigl(\exp(\mathrm{clamp}(\sum_t \log r_{i,t}, \pm 20)),\ C\bigr)$,
      the sum over the response's tokens (``response_mask``: tokens a rejection mask turned into
      padding included, as veRL computes the weight before its rejection), unclamped before the sum.

    The weight is a constant (stop-gradient); the loss *value* contains $\log\pi$, as veRL's
    losses compute it; only its gradient is meaningful.

    **GPG** (Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546, the GPG objective; veRL 0.9.1's ``policy_loss.loss_mode=gpg``,
    ``compute_policy_loss_gpg`` in ``verl/trainer/ppo/core_algos.py``): ``is_weight: none``. GPG
    trains on-policy with one update per batch, so there is no ratio to correct for; its authors'
    trainer (``AMAP-ML/GPG``, ``open-r1/src/open_r1/gpg_trainer.py`` lines 299-303, ``compute_loss``:
    ``per_token_loss = - per_token_logps * advantages.unsqueeze(1)``, then the token mean over the
    batch) aggregates ``token-mean``, as the ``gpg`` preset does.

    **veRL's bypass mode** (``algorithm.rollout_correction.bypass_mode=True``,
    ``loss_type=reinforce``; ``compute_policy_loss_bypass_mode`` and
    ``compute_policy_loss_reinforce`` in ``core_algos.py``, weights from
    ``compute_rollout_correction_weights`` in ``verl/trainer/ppo/rollout_corr_helper.py``): veRL
    skips the old-policy pass and hands the inference engine's log-probabilities as
    ``old_log_prob``, so $r = \pi_\theta / \pi_{rollout}$, and weighs REINFORCE by the detached
    ``rollout_is`` weight of that ratio: ``is_weight: token`` or ``sequence`` with ``is_cap`` =
    ``rollout_is_threshold`` (veRL's default 2.0, the default here). The exponent is clamped at
    $\pm 20$ and the sequence log-ratio summed unclamped, as veRL does. Its rejection sampling
    (``rollout_rs``) is the [`BypassRejection`][rlstab.masks.BypassRejection] mask. Not
    expressed: ``rollout_is_batch_normalize`` (veRL divides the weights by their mean over the
    micro-batch) and IcePop thresholds (``"lower_upper"``: use a token ``bypass_rejection`` k1
    band with ``rejected: masked`` and ``is_cap`` = the upper bound). ``is_weight: token`` with
    ``is_cap`` $C$ is [`CISPO`][rlstab.clipping.CISPO] with ``min_weight = 0``,
    ``max_weight = C``.

    Metrics: with a weight, ``clip/high_fraction``: the valid tokens whose weight was truncated
    (they still train).
    """

    kind: Literal["reinforce"] = "reinforce"
    is_weight: Literal["none", "token", "sequence"] = "none"
    """``none``: plain REINFORCE (GPG). ``token`` / ``sequence``: weigh by the detached truncated ratio pi/pi_old."""
    is_cap: float = Field(2.0, gt=0.0, le=1e6)
    """C: the truncation of the importance weight (veRL's ``rollout_is_threshold``, default 2.0)."""

    def weight_of(self, t: Tokens) -> torch.Tensor | None:
        """The detached importance weight (``[B, T]`` or ``[B, 1]``), or None for ``is_weight: none``."""
        if self.is_weight == "none":
            return None
        # Over the response's tokens (response_mask), rejected ones included: the weight is the likelihood
        # ratio of the sampled response, as veRL computes it before its rejection. `where`, not a multiply:
        # padding may hold huge values (inf * 0 is NaN).
        log_ratio = torch.where(t.batch.response_mask, t.logprobs - t.old_logprobs, 0.0)
        if self.is_weight == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True)
        return log_ratio.clamp_(-SAFETY_BOUND, SAFETY_BOUND).exp_()

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        adv = t.advantage_rows
        raw = self.weight_of(t)
        counts: dict[str, torch.Tensor] = {}
        if raw is None:
            grad = weight * adv.neg()
            per_token = torch.where(t.valid_bool, t.logprobs.neg() * adv, 0.0)  # veRL gpg: -log_prob * advantages
        else:
            is_weight = raw.clamp(max=self.is_cap)
            grad = (weight * adv.neg()) * is_weight  # weight first: a zero weight silences padding
            per_token = torch.where(t.valid_bool, adv.neg() * t.logprobs * is_weight, 0.0)  # veRL reinforce's order
            truncated = indicator(torch.gt, raw, self.is_cap).expand_as(t.valid)
            counts["clip/high_fraction"] = torch.dot(t.valid.reshape(-1), truncated.reshape(-1))
        # `where` rather than a multiply, so that huge finite padding cannot turn into inf * 0.
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        if self.is_weight == "none":
            return "reinforce: l = -A log p (no ratio, no clipping)"
        r = "r" if self.is_weight == "token" else "prod_t r"
        return (
            f"reinforce ({self.is_weight} IS): l = -sg(min({r}, {self.is_cap:g})) A log p, r = pi/pi_old "
            "(gradient only through log p)"
        )
