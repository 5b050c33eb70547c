"""float32 views of a micro-batch, computed once and shared by every component.

Components never touch a [`TokenBatch`][rlstab.TokenBatch] directly: they read a ``Tokens``, in which
every tensor is float32 (whatever the trainer's dtype), detached (gradients are handled by the
compiled loss), laid out ``[B, T]`` and contiguous, and the 0/1 masks are float so that masking is a
multiply.

Contiguous, because a trainer may hand over any strided view (a transposed ``[T, B]`` buffer, a
slice with a step, an ``expand``-ed per-response tensor): the components flatten tensors with
``view(-1)`` and write selections through ``view(-1)[index]``, which need a dense row-major layout.
``.contiguous()`` returns the tensor itself when it already is, so the usual contiguous float32
input is neither copied nor changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlstab.batch import TokenBatch
from rlstab.lazy import torch


def f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` detached, float32 and contiguous (``t`` itself, detached, when it already is all three).

    Only a tensor with a gradient is detached: a detach is an operation dispatched on every call, and
    one without a gradient is detached already."""
    if t is None:
        return None
    return (t.detach() if t.requires_grad else t).to(torch.float32).contiguous()


@dataclass
class Tokens:
    """One micro-batch as the components see it: what a component's methods receive as ``t``.

    Every tensor is float32, detached and contiguous, ``[B, T]`` unless said otherwise. Padding
    (``valid`` 0) may hold anything, NaN and infinities included: select with
    ``torch.where(t.valid_bool, x, 0.0)``, never ``x * t.valid``.

    Attributes:
        batch: the [`TokenBatch`][rlstab.TokenBatch] as the trainer gave it (its own dtypes, with
            gradients): for the fields not copied here (``rewards``, ``group_ids``, ``is_weights``, ...).
        valid: 1.0 on response tokens, 0.0 on padding.
        valid_bool: ``valid`` as bool.
        logprobs: current policy log-probabilities (detached: the compiled loss handles the gradient).
        old_logprobs: behaviour policy log-probabilities (``logprobs`` when on-policy).
        log_ratio: ``clamp(logprobs - old_logprobs, -c, c)``, ``c`` = ``log_ratio_clamp``.
        ratio: ``exp(log_ratio)``.
        entropy: the batch's ``entropy`` as float32, or None when the trainer sent none.
        rollout_logprobs: the batch's ``rollout_logprobs`` (the inference engine's) as float32, or None.
        ref_logprobs: the batch's ``ref_logprobs`` (the reference policy's) as float32, or None.
        log_ratio_clamp: the objective's ``log_ratio_clamp`` (``c`` above).
        advantages: ``[B, T]`` (a ``[B]`` input is broadcast), set once the step's estimator ran; None before.
        advantage_rows: the same, but ``[B, 1]`` when the advantages are per response (cheaper to multiply).
        advantage_per_response: ``[B]`` when the advantages are per response, else None.

    ``valid_rows()``, ``valid_count()``: each response's valid tokens and all of them, computed once per ``valid``.
    """

    batch: TokenBatch
    valid: torch.Tensor
    valid_bool: torch.Tensor
    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    entropy: torch.Tensor | None
    rollout_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    log_ratio_clamp: float
    advantages: torch.Tensor | None = None
    advantage_rows: torch.Tensor | None = None
    advantage_per_response: torch.Tensor | None = None

    @classmethod
    def from_batch(cls, batch: TokenBatch, log_ratio_clamp: float) -> Tokens:
        logprobs = f32(batch.logprobs)
        old = logprobs if batch.old_logprobs is None else f32(batch.old_logprobs)
        log_ratio = (logprobs - old).clamp_(-log_ratio_clamp, log_ratio_clamp)
        valid_bool = batch.response_mask.contiguous()
        return cls(
            batch=batch,
            valid=valid_bool.to(torch.float32),
            valid_bool=valid_bool,
            logprobs=logprobs,
            old_logprobs=old,
            log_ratio=log_ratio,
            ratio=torch.exp(log_ratio),
            entropy=f32(batch.entropy),
            rollout_logprobs=f32(batch.rollout_logprobs),
            ref_logprobs=f32(batch.ref_logprobs),
            log_ratio_clamp=log_ratio_clamp,
        )

    def set_advantages(self, advantages: torch.Tensor) -> None:
        adv = f32(advantages)
        # Per-response advantages stay [B, 1]: elementwise ops on a [B, T] broadcast view run a slow
        # strided kernel, while a [B, 1] operand costs nothing and broadcasts at the next multiply.
        self.advantage_rows = adv.unsqueeze(-1) if adv.dim() == 1 else adv
        self.advantages = self.advantage_rows.expand_as(self.logprobs)
        self.advantage_per_response = adv if adv.dim() == 1 else None

    def valid_count(self) -> torch.Tensor:
        """0-d: the valid tokens, ``valid.sum()``; summed once for each ``valid``. Do not modify it."""
        return self._once("_count", lambda valid: valid.sum())

    def valid_rows(self) -> torch.Tensor:
        """``[B]``: each response's valid tokens, ``valid.sum(-1)``; summed once for each ``valid`` (the loss,
        its metrics and the step's counts all read it). Do not modify it."""
        return self._once("_rows", lambda valid: valid.sum(-1))

    def _once(self, name: str, compute) -> torch.Tensor:
        """``compute(valid)``, kept (as a plain attribute, not a field) until ``valid`` is replaced."""
        kept = self.__dict__.get(name)
        if kept is None or kept[0] is not self.valid:
            kept = self.__dict__[name] = (self.valid, compute(self.valid))
        return kept[1]
