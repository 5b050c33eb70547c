"""OpenRLHF's train/rollout importance-sampling correction, as rlstab ``is_weights``.

OpenRLHF 0.11.2's ``PolicyLoss`` (``policy_loss_type="ppo"``) multiplies each token's clipped
loss by a constant coefficient computed from the old (DeepSpeed) and rollout (vLLM)
log-probabilities, before aggregation, with the same denominators. That is exactly what
[`TokenBatch.is_weights`][rlstab.TokenBatch] does, so the coefficient is computed here, from
OpenRLHF's own settings (``--algo.advantage.is_correction_*``), and handed to the objective.

With q = pi_train(old) and p = pi_rollout per token, and a unit = a token (``level="token"``) or
a response (``level="seq"``):

- gating ``ratio``: the statistic is q/p per token, or exp(mean_t log(q/p)) per response;
  ``binary_kl``: p log(p/q) + (1-p) log((1-p)/(1-q)); ``tv``: |p - q| (p, q clamped to
  [1e-6, 1 - 1e-6]), averaged over the response at ``level="seq"``.
- mode ``clip``: coefficient = statistic clamped to [low, high] (token level, ratio gating only);
  ``mask``: coefficient = q/p of the token where its unit's statistic is inside [low, high], 0 outside.

Also OpenRLHF's two diagnostics: ``vllm_kl`` = mean over valid tokens of log p - log q, and
``is_filter_ratio`` = the fraction of units outside the band (valid tokens at token level, all
responses of the micro-batch at sequence level, as OpenRLHF counts them).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlstab.lazy import torch


@dataclass(frozen=True)
class ISCorrection:
    """OpenRLHF's ``is_correction_level / mode / gating / threshold`` (validated by OpenRLHF's constructor)."""

    level: str
    mode: str
    gating: str
    low: float
    high: float

    @property
    def enabled(self) -> bool:
        return self.level != "off"

    def weights(
        self, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(coefficient [B, T], vllm_kl, is_filter_ratio)``, all without gradient."""
        old, rollout = old_logprobs.detach(), rollout_logprobs.detach()
        valid = mask.to(old.dtype)
        seq = self.level == "seq"
        log_is = old - rollout  # log(pi_train / pi_rollout)
        token_is = log_is.exp()
        if self.gating == "ratio":
            stat = _row_mean(log_is, valid).exp() if seq else token_is
        else:
            p = rollout.exp().clamp(1e-6, 1 - 1e-6)
            q = old.exp().clamp(1e-6, 1 - 1e-6)
            if self.gating == "binary_kl":
                stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
            else:  # tv
                stat = (p - q).abs()
            if seq:
                stat = _row_mean(stat, valid)
        # A response without valid tokens has a NaN statistic at sequence level (0/0), which is
        # outside every band: OpenRLHF counts it as filtered, and so does this.
        inside = (stat >= self.low) & (stat <= self.high)
        if self.mode == "clip":
            coefficient = stat.clamp(min=self.low, max=self.high)
        else:
            coefficient = torch.where(inside, token_is, torch.zeros((), dtype=token_is.dtype, device=token_is.device))
        outside = (~inside).to(old.dtype)
        if seq:
            filtered = outside.mean()
        else:
            filtered = (outside * valid).sum() / valid.sum()
        vllm_kl = ((rollout - old) * valid).sum() / valid.sum()
        return coefficient.expand_as(old), vllm_kl, filtered


def _row_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B, 1]`` mean over each response's valid tokens (NaN for an empty response, as in OpenRLHF)."""
    return ((x * valid).sum(-1) / valid.sum(-1)).unsqueeze(-1)
