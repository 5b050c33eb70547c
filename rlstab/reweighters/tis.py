"""Truncated importance sampling (TIS) for trainer/inference mismatch."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

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

    ``floor`` (default null: none) also clamps the ratio from below, $w = \mathrm{clip}(\cdot,
    C_{min}, C)$: TRL 1.16's ``vllm_importance_sampling_clip_min`` in its ``*_truncate`` modes
    (``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._generate_and_score_completions``: ``torch.clamp(ratio,
    min=clip_min, max=clip_max)``; TRL's default ``clip_min = None``, ``clip_max = 3``).

    TRL's four ``vllm_importance_sampling_mode`` values, in rlstab (with ``C_min``/``C_max`` its
    ``vllm_importance_sampling_clip_min``/``vllm_importance_sampling_clip_max``):

    - ``token_truncate``: ``tis`` (token, ``cap: C_max``, ``floor: C_min``);
    - ``sequence_truncate``: ``tis`` (sequence, ``cap: C_max``, ``floor: C_min``);
    - ``token_mask``: ``icepop`` (``low: C_min`` or 0, ``high: C_max``, ``rejected: masked``) and
      ``tis`` (token, ``cap: C_max``): the ratio where it lies in the band, 0 outside;
    - ``sequence_mask``: ``rollout_rejection`` (k1, ``sequence_sum``, ``low: C_min`` or 0,
      ``high: C_max``, ``rejected: masked``) and ``tis`` (sequence, ``cap: C_max``).

    TRL exponentiates the (sequence-summed) log-ratio without a clamp; rlstab clamps at
    $\pm 20$, which changes nothing while $C < e^{20}$.

    ``cap: null`` leaves the ratio untruncated: the token weight that ``seq_mask_tis`` keeps
    (NeMo-RL's and OpenRLHF's "non-truncated token-level IS correction") and the sequence weight of
    ``seq_mis``. Only a mask in front of it (a band on the ratio) then bounds it.
    """

    kind: Literal["tis"] = "tis"
    level: Literal["token", "sequence"] = "token"
    """``token``: one ratio per token; ``sequence``: the product over the response."""
    cap: float | None = Field(2.0, gt=0.0)
    """Truncation C; null: none (the plain importance weight, as seq-mask-tis keeps it)."""
    floor: float | None = Field(None, ge=0.0)
    """Lower clamp C_min of the ratio (TRL's ``vllm_importance_sampling_clip_min``); null: none."""
    _later_fields: ClassVar[tuple[str, ...]] = ("floor",)

    @model_validator(mode="after")
    def _floor_below_cap(self):
        if self.floor is not None and self.cap is not None and self.floor > self.cap:
            raise ValueError(f"floor ({self.floor}) must not exceed cap ({self.cap})")
        return self

    reads: ClassVar[frozenset[str]] = frozenset({"rollout_logprobs"})

    def weights(self, t, step) -> torch.Tensor:
        # where, not a multiply by valid: padding may hold huge values (inf * 0 is NaN)
        log_ratio = torch.where(t.valid_bool, t.old_logprobs - t.rollout_logprobs, 0.0)
        if self.level == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True)
        w = log_ratio.clamp_(-20.0, 20.0).exp_()
        return w if self.floor is None and self.cap is None else w.clamp_(min=self.floor, max=self.cap)

    def describe(self) -> str:
        ratio = "pi_train(old)/pi_infer(old)" if self.level == "token" else "prod_t pi_train(old)/pi_infer(old)"
        if self.cap is None:
            return f"tis ({self.level}): w = {ratio}" + ("" if self.floor is None else f", at least {self.floor:g}")
        if self.floor is None:
            return f"tis ({self.level}): w = min({ratio}, {self.cap:g})"
        return f"tis ({self.level}): w = clip({ratio}, {self.floor:g}, {self.cap:g})"
