"""Truncated importance sampling (TIS) for trainer/inference mismatch."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.reweighters.base import Reweighter


class TruncatedIS(Reweighter):
    r"""Weight each token by the truncated ratio of the trainer's and the inference engine's probabilities.

    $$w_{i,t} = \min\!\left(\frac{\pi_{train}(y_t;\theta_{old})}{\pi_{infer}(y_t;\theta_{old})},\ C\right)
      \qquad\text{(token)}\qquad
      w_i = \min\!\left(\prod_t \frac{\pi_{train}}{\pi_{infer}},\ C\right)\qquad\text{(sequence)}$$

    The sampler (vLLM, SGLang) and the trainer compute different probabilities for the same
    weights, so the "on-policy" samples are slightly off-policy; TIS (Yao et al., "Your Efficient
    RL Framework Secretly Brings You Off-Policy RL Training", 2025) corrects with the importance
    ratio, truncated at ``C = 2`` (their default) to bound the variance. Reads
    ``TokenBatch.rollout_logprobs``; ``old_logprobs`` are the trainer's. The log-ratio is
    clamped to ``[-20, 20]`` before ``exp`` (the sequence sum too).
    """

    kind: Literal["tis"] = "tis"
    level: Literal["token", "sequence"] = "token"
    """``token``: one ratio per token; ``sequence``: the product over the response."""
    cap: float = Field(2.0, gt=0.0)
    """Truncation C."""

    reads: ClassVar[frozenset[str]] = frozenset({"rollout_logprobs"})

    def weights(self, t, step) -> torch.Tensor:
        # where, not a multiply by valid: padding may hold huge values (inf * 0 is NaN)
        log_ratio = torch.where(t.valid_bool, t.old_logprobs - t.rollout_logprobs, 0.0)
        if self.level == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True)
        return log_ratio.clamp_(-20.0, 20.0).exp_().clamp_(max=self.cap)

    def describe(self) -> str:
        ratio = "pi_train(old)/pi_infer(old)" if self.level == "token" else "prod_t pi_train(old)/pi_infer(old)"
        return f"tis ({self.level}): w = min({ratio}, {self.cap:g})"
