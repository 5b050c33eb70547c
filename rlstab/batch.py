"""The tensors a loss reads, under one set of names, and the loss's result.

Every adapter maps its trainer's names onto [`TokenBatch`][rlstab.TokenBatch] in exactly one place, so the
components only ever see these names and shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from rlstab.lazy import torch

# Fields laid out per token, [B, T].
TOKEN_FIELDS = ("logprobs", "old_logprobs", "entropy", "rollout_logprobs", "ref_logprobs", "sum_pi_squared",
                "proxy_logprobs")
# Fields laid out per sequence, [B].
SEQUENCE_FIELDS = ("rewards", "group_ids", "grad_sq_norms", "is_branch")
# Integer fields laid out per token, [B, T].
TOKEN_ID_FIELDS = ("token_ids",)
# Fields laid out per sequence with several columns, [B, K].
SEQUENCE_MATRIX_FIELDS = ("reward_components",)
# Log-probabilities: at most 0 on every valid token.
LOGPROB_FIELDS = ("logprobs", "old_logprobs", "rollout_logprobs", "ref_logprobs", "proxy_logprobs")

ROUNDING = 0.5
"""How far beyond its range (log-probs above 0, an entropy below 0) a valid token's value may lie before the
loss refuses it as the wrong tensor (``BatchError``).

A log-prob computed in one precision (``log_softmax``, ``logits.gather - logsumexp``, ``-cross_entropy``, in
float32, float16 or bfloat16) is never above 0: rounding a value at most 0 keeps it at most 0. Values above 0
come from mixing precisions, and an entropy below 0 from the formula ``logsumexp(x) - sum(softmax(x) * x)``,
which veRL's ``entropy_from_logits`` evaluates in the logits' dtype: both subtract two quantities of the size
of the logits. bfloat16 keeps 8 significant bits, so each rounding of a quantity below 128 in magnitude moves
it by at most 0.25 (half its spacing 0.5 in [64, 128)), and a difference of two by at most 0.5; LLM logits,
even divided by a sampling temperature, stay below 128. Measured on bfloat16 logits below 128 in magnitude
(torch 2.13, CPU): veRL's entropy formula gives entropies down to -0.5 (-0.25 for logits below 64), a float32
target logit minus a bfloat16 log-sum-exp gives log-probs up to +0.25, and ``log_softmax`` nothing above 0.
The wrong tensors this catches lie far beyond: logits (a sampled token's is several units), probabilities
(some sampled token of a batch has p > 0.5), log-probs passed as entropy (some token of a batch has
p < e^-0.5 = 0.61).
"""

VALUE_LIMITS: dict[str, tuple[float, float]] = {
    **{name: (-math.inf, ROUNDING) for name in LOGPROB_FIELDS},
    "entropy": (-ROUNDING, math.inf),
}
"""``(lowest, highest)`` value a valid token of each field may hold (fields not named: any finite value)."""

VALUE_RULES = {
    **{name: "a log-probability is at most 0" for name in LOGPROB_FIELDS},
    "entropy": "an entropy is at least 0",
}
"""Why each field has its limits, for the message."""

LIKELY_MISTAKES = {
    **{name: "Logits or probabilities passed as log-probs?" for name in LOGPROB_FIELDS},
    "entropy": "Log-probs passed as entropy?",
}
"""What a value beyond ``VALUE_LIMITS`` usually means, for the message."""


class BatchError(ValueError):
    """A batch whose tensors do not fit together (shape, dtype, device, missing field), or hold values its
    fields cannot hold (a log-prob above 0, a negative entropy)."""


@dataclass
class TokenBatch:
    """One micro-batch of responses, padded to ``[B, T]``.

    Attributes:
        logprobs: ``[B, T]`` log-probability of each sampled token under the current policy;
            carries the gradient.
        response_mask: ``[B, T]`` True where the token belongs to the response (valid token).
            Integer or float 0/1 masks are accepted and converted to bool; any other value (0.5,
            -1, NaN) is refused. A row without a response token is a *padding row*: it changes
            nothing, whatever its other fields hold (its reward and group id included: advantage
            estimators leave it out and give it advantage 0).
        old_logprobs: ``[B, T]`` log-probabilities under the policy that sampled the batch (the
            "old" policy of PPO). ``None`` means on-policy: ``logprobs.detach()`` is used, so the
            ratio is exactly 1 and only its gradient matters.
        advantages: ``[B]`` (one per response) or ``[B, T]`` (per token). When ``None`` the
            objective's advantage estimator computes them from ``rewards`` and ``group_ids``.
            Advantages take precedence: with both advantages and rewards in a batch, the
            estimator does not run and the rewards are ignored (unless a component reads them,
            as ``group_filter`` does); a compiled objective warns once when nothing reads them.
        entropy: ``[B, T]`` entropy of the policy's next-token distribution, normally detached.
            Masks read it detached; an entropy bonus needs it with gradient.
        rollout_logprobs: ``[B, T]`` log-probabilities reported by the inference engine (vLLM,
            SGLang) for trainer/inference mismatch corrections.
        ref_logprobs: ``[B, T]`` log-probabilities under the reference policy, for KL terms.
        is_weights: ``[B, T]`` (per token) or ``[B]`` (per response) importance weights that a
            trainer's rollout correction computed (veRL's ``rollout_is_weights``). Each token's
            policy loss is multiplied by its weight, a constant (no gradient), exactly where veRL's
            built-in losses multiply ``pg_losses``; masks, clip metrics and denominators ignore it.
        rewards: ``[B]`` scalar outcome reward of each response.
        group_ids: ``[B]`` integer id of the prompt each response answers (its GRPO group).
        grad_sq_norms: ``[B]`` squared norm of each response's score-function gradient,
            ``||grad_theta sum_t log pi(y_t)||^2`` over its response tokens (no gradient), for VCPO's
            off-policy optimal baseline (advantage ``opob``). Only a trainer that backpropagates
            each response on its own can supply it exactly (rlstab's embedded trainer does).
        is_branch: ``[B]`` bool, True on the rows of DEEP-GRPO's local branches (continuations
            resampled from a pivot of a failed response), which ``dual_stream`` aggregates apart.
        reward_components: ``[B, K]`` the K reward dimensions of each response (format, accuracy,
            length, ...), kept apart for GDPO (advantage ``gdpo``), which normalises each within
            the prompt group before combining them; veRL's are the ``algorithm.gdpo_reward_keys``
            entries of the reward function's extra info. ``rewards`` stays the scalar reward.
        sum_pi_squared: ``[B, T]`` sum over the vocabulary of the squared next-token probabilities,
            ``sum_v pi(v)^2``, at each response position under the old policy (no gradient), for the
            optimal token baseline (advantages ``optimal_token_baseline``, ``tir_optimal_token_baseline``):
            veRL computes it in the old-log-prob pass with ``actor.calculate_sum_pi_squared=True``;
            rlstab's embedded trainer in its own old-policy pass.
        proxy_logprobs: ``[B, T]`` log-probability of each sampled token under Lp-Reg's proxy of the old
            policy (no gradient): its next-token distribution with the tokens below ``min_p`` times the
            most likely one removed and the rest renormalised
            (``rlstab.clipping.lp_reg.min_p_proxy_logprobs``; a removed token gets about -1e4). Read by
            the surrogate ``lp_reg``; rlstab's embedded trainer computes it in its old-policy pass.
        token_ids: ``[B, T]`` integer vocabulary id of each response token (the sampled token whose
            log-probability ``logprobs`` holds), for GTPO's conflict tokens (reweighter ``gtpo_conflict``),
            which compares the tokens of a prompt group's responses position by position. Any integer
            dtype; padding may hold anything (the trainer's pad id). rlstab's embedded trainer supplies it;
            the veRL, OpenRLHF and TRL adapters do not (they refuse a component that reads it).

    Any layout is accepted (a transposed or column-major buffer, a slice with a step, an
    ``expand``-ed view): the loss reads contiguous float32 copies where needed and the gradient
    reaches ``logprobs`` as given. Construction checks shapes, dtypes and devices (``meta`` tensors,
    which hold no values, are refused), and the values of a non-bool ``response_mask`` (one host
    synchronisation; a bool mask costs none).

    The values of the fields a loss reads are judged by the loss and by ``gather``, on valid tokens only
    (padding may hold anything), with no host synchronisation of their own
    (``rlstab.compiler.offending_inputs``): a NaN or an infinity raises ``FloatingPointError``; a log-prob
    above 0 or an entropy below 0 by more than rounding (``ROUNDING``, 0.5) raises ``BatchError`` naming the
    field, the worst value, its index and the likely mistake (logits or probabilities passed as log-probs,
    log-probs passed as entropy).
    """

    logprobs: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    grad_sq_norms: torch.Tensor | None = None
    is_branch: torch.Tensor | None = None
    reward_components: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None
    proxy_logprobs: torch.Tensor | None = None
    token_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self._validate()

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)``: responses and padded response length."""
        return tuple(self.logprobs.shape)  # type: ignore[return-value]

    def has(self, name: str) -> bool:
        """Whether the optional field ``name`` is present."""
        return getattr(self, name) is not None

    def _replaced(self, **fields: torch.Tensor) -> TokenBatch:
        """This batch with ``fields`` replaced by tensors of the same shapes, dtypes and device (a loss's own
        copies, zeroed on padding): not validated again, since nothing that validation checks changed."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.__dict__.update(fields)
        return out

    def _validate(self) -> None:
        lp = self.logprobs
        if not isinstance(lp, torch.Tensor):
            raise BatchError(f"TokenBatch.logprobs must be a torch.Tensor, got {type(lp).__name__}")
        if lp.dim() != 2:
            raise BatchError(f"TokenBatch.logprobs must be [B, T], got shape {tuple(lp.shape)}")
        if not lp.is_floating_point():
            raise BatchError(f"TokenBatch.logprobs must be floating point, got {lp.dtype}")
        if lp.device.type == "meta":
            raise BatchError(
                "TokenBatch.logprobs is on the meta device, which holds shapes but no values: build the batch "
                "from tensors with values (on the CPU or a GPU)"
            )
        B, T = lp.shape
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise BatchError(f"TokenBatch.{f.name} must be a torch.Tensor, got {type(value).__name__}")
            if value.device != lp.device:
                raise BatchError(
                    f"TokenBatch.{f.name} is on {value.device} but logprobs is on {lp.device}"
                )
        mask = self.response_mask
        if tuple(mask.shape) != (B, T):
            raise BatchError(f"TokenBatch.response_mask must be [B, T] = {[B, T]}, got {list(mask.shape)}")
        if mask.dtype != torch.bool:
            if mask.is_complex():
                raise BatchError(f"TokenBatch.response_mask must be bool or 0/1, got {mask.dtype}")
            if _outside_0_1(mask):
                off = (mask != 0) & (mask != 1)  # NaN is neither
                where = off.nonzero()[0].tolist()
                raise BatchError(
                    f"TokenBatch.response_mask must hold only 0 and 1 (or be bool): {int(off.sum())} value(s) are "
                    f"neither, the first at index {where}: {mask[tuple(where)].item()}"
                )
            self.response_mask = mask != 0
        for name in TOKEN_FIELDS[1:]:
            value = getattr(self, name)
            if value is not None:
                if tuple(value.shape) != (B, T):
                    raise BatchError(f"TokenBatch.{name} must be [B, T] = {[B, T]}, got {list(value.shape)}")
                if not value.is_floating_point():
                    raise BatchError(f"TokenBatch.{name} must be floating point, got {value.dtype}")
        for name in ("advantages", "is_weights"):
            value = getattr(self, name)
            if value is None:
                continue
            if tuple(value.shape) not in ((B,), (B, T)):
                raise BatchError(f"TokenBatch.{name} must be [B] or [B, T] with B={B}, T={T}, got {list(value.shape)}")
            if not value.is_floating_point():
                raise BatchError(f"TokenBatch.{name} must be floating point, got {value.dtype}")
        if self.rewards is not None:
            if tuple(self.rewards.shape) != (B,):
                raise BatchError(f"TokenBatch.rewards must be [B] = [{B}], got {list(self.rewards.shape)}")
            if not self.rewards.is_floating_point():
                self.rewards = self.rewards.float()
        if self.grad_sq_norms is not None:
            if tuple(self.grad_sq_norms.shape) != (B,):
                raise BatchError(f"TokenBatch.grad_sq_norms must be [B] = [{B}], got {list(self.grad_sq_norms.shape)}")
            if not self.grad_sq_norms.is_floating_point():
                raise BatchError(f"TokenBatch.grad_sq_norms must be floating point, got {self.grad_sq_norms.dtype}")
        if self.is_branch is not None:
            if tuple(self.is_branch.shape) != (B,) or self.is_branch.dtype != torch.bool:
                raise BatchError(
                    f"TokenBatch.is_branch must be a bool [B] = [{B}] tensor, got {self.is_branch.dtype} "
                    f"{list(self.is_branch.shape)}"
                )
        if self.reward_components is not None:
            value = self.reward_components
            if value.dim() != 2 or value.shape[0] != B:
                raise BatchError(f"TokenBatch.reward_components must be [B, K] with B={B}, got {list(value.shape)}")
            if not value.is_floating_point():
                raise BatchError(f"TokenBatch.reward_components must be floating point, got {value.dtype}")
        if self.token_ids is not None:
            if tuple(self.token_ids.shape) != (B, T):
                raise BatchError(f"TokenBatch.token_ids must be [B, T] = {[B, T]}, got {list(self.token_ids.shape)}")
            if self.token_ids.is_floating_point() or self.token_ids.is_complex() or self.token_ids.dtype == torch.bool:
                raise BatchError(f"TokenBatch.token_ids must be an integer tensor, got {self.token_ids.dtype}")
        if self.group_ids is not None:
            if tuple(self.group_ids.shape) != (B,):
                raise BatchError(f"TokenBatch.group_ids must be [B] = [{B}], got {list(self.group_ids.shape)}")
            if self.group_ids.is_floating_point() or self.group_ids.dtype == torch.bool:
                raise BatchError(f"TokenBatch.group_ids must be an integer tensor, got {self.group_ids.dtype}")


def _outside_0_1(mask: torch.Tensor) -> bool:
    """Whether a numeric mask holds anything but 0 and 1 (one host synchronisation).

    An integer mask needs one reduction (within [0, 1] means 0 or 1); a float mask two passes
    (0.5 lies within, NaN compares false with both).
    """
    if mask.numel() == 0:
        return False
    if not mask.is_floating_point():
        low, high = torch.aminmax(mask)
        return bool((low < 0) | (high > 1))
    return bool(((mask != 0) & (mask != 1)).any())


@dataclass
class LossOutput:
    """What a compiled objective returns for one micro-batch.

    Attributes:
        loss: scalar float32 tensor to call ``backward()`` on.
        metrics: floats by name, ``<component>/<quantity>`` (for example ``mask/s2t/silenced``,
            ``clip/high_fraction``), as a read-only mapping ([`Metrics`][rlstab.metrics.Metrics]):
            on a GPU the values stay on the device until the first read, which transfers them all
            at once and raises any check the call deferred. ``dict(out.metrics)`` is a plain dict
            for any logger.
    """

    loss: torch.Tensor
    metrics: Mapping[str, float]
