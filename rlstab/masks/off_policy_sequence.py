r"""DeepSeek-V3.2's off-policy sequence mask: drop negative-advantage responses the policy has moved far from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.masks.base import Mask
from rlstab.tokens import Tokens


class OffPolicySequence(Mask):
    r"""Silence every token of a negative-advantage response whose sampling policy is far from the current one.

    DeepSeek-V3.2 (arXiv 2512.02556, section 3.1, "Off-Policy Sequence Masking", eq. 9):

    $$M_{i,t} = 0 \iff \hat A_{i,t} < 0 \;\wedge\; \frac{1}{|o_i|}\sum_{t=1}^{|o_i|}
      \log\frac{\pi_{old}(o_{i,t})}{\pi_\theta(o_{i,t})} > \delta, \qquad M_{i,t} = 1 \text{ otherwise,}$$

    where $\pi_{old}$ is the policy that sampled the response (the inference engine's) and
    $\pi_\theta$ the current policy (detached). The statistic is the response's mean per-token
    log-ratio, a sample estimate of $\mathrm{KL}(\pi_{old}\,\|\,\pi_\theta)$ along the response: it
    catches both the policy's drift over off-policy updates and the train/inference mismatch.
    Responses with $\hat A \ge 0$ always train (the report: negative samples that are far off-policy
    are the ones that destabilise). With per-token advantages the sign test is per token.

    Choices, and where they come from (TRL 1.16 implements the mask as
    ``GRPOTrainer.get_off_policy_mask``, ``trl/trainer/grpo_trainer.py``, called from
    ``GRPOTrainer._compute_loss`` when ``off_policy_mask_threshold`` is set; DeepSeek released no training code):

    - ``threshold`` ($\delta$): required. The report gives no value; TRL has no default (its
      documentation suggests 0.5, the ``dsv32_mask`` preset's value).
    - ``behaviour`` ($\pi_{old}$): ``rollout`` (default) reads ``TokenBatch.rollout_logprobs``,
      the sampling policy of eq. 9, which TRL uses whenever vLLM returns them
      (``sampling_per_token_logps``); ``old`` reads ``old_logprobs`` (the trainer's recomputed
      old policy: TRL's fallback without vLLM, drift only, no train/inference mismatch).
    - comparisons: rejected iff $A < 0$ (strict) and the mean $> \delta$ (strict), as eq. 9 and TRL.
    - the mean runs over the response's own tokens (``response_mask``), whatever other masks
      do, and divides by their number (TRL: ``mask.sum(-1).clamp(min=1)``). An empty response
      has mean 0 and is kept.
    - rejected tokens are silenced but stay in ``count: valid`` denominators, as eq. 9 places
      $M$ inside the $1/|o_i|$ sum and TRL multiplies the token loss by the mask without touching
      its ``mask``. (Unlike the rollout masks there is no ``rejected: padding``: the test reads
      the advantage, which the step computes only after padding is settled.)

    Scope: the statistic is per response, and a response lies whole in one micro-batch, so the
    mask is the same at any micro-batch size and number of ranks (no step statistic). It reads
    the *current* policy, so, as in TRL, a response's fate can change between the epochs of a
    multi-epoch update.

    Metrics: ``mask/off_policy_sequence/kept`` (fraction of valid tokens kept).
    """

    kind: Literal["off_policy_sequence"] = "off_policy_sequence"
    threshold: float = Field(gt=0.0)
    """delta: a negative-advantage response whose mean log(pi_old / pi_theta) exceeds it is silenced."""
    behaviour: Literal["rollout", "old"] = "rollout"
    """Whose log-probabilities stand for pi_old: the inference engine's (``rollout_logprobs``) or ``old_logprobs``."""

    @property
    def reads(self) -> frozenset[str]:  # the sampling policy's log-probabilities only with behaviour: rollout
        return frozenset({"rollout_logprobs"}) if self.behaviour == "rollout" else frozenset()

    def mean_log_ratio(self, t: Tokens) -> torch.Tensor:
        """``[B, 1]``: each response's mean of ``log pi_old - log pi_theta`` over its own tokens."""
        response = t.batch.response_mask
        sampling = t.rollout_logprobs if self.behaviour == "rollout" else t.old_logprobs
        log_ratio = torch.where(response, sampling - t.logprobs, 0.0)  # padding may hold anything
        return log_ratio.sum(-1, keepdim=True) / response.sum(-1, keepdim=True).clamp(min=1)

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        rejected = (self.mean_log_ratio(t) > self.threshold) & (t.advantage_rows < 0)
        return (~rejected).to(torch.float32).expand_as(t.logprobs)

    def describe(self) -> str:
        old = "pi_infer" if self.behaviour == "rollout" else "pi_old"
        return (
            f"off_policy_sequence: silence response i iff A < 0 and mean_t log({old}/pi_theta) > {self.threshold:g} "
            "(silenced tokens stay in count: valid)"
        )
