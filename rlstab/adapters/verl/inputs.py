"""veRL's tensors as a [`TokenBatch`][rlstab.TokenBatch]: the only place veRL's tensor names appear.

Two callers hand over the same tensors under the same names: the policy loss, which verl's
``ppo_loss`` calls with keywords, and the step scope, which reads them from the mini-batch
(a ``TensorDict``) that ``TrainingWorker.train_batch`` trains on:

| veRL | rlstab |
|---|---|
| ``log_prob`` (the current policy's; with grad in the loss) | ``logprobs`` |
| ``old_log_prob`` / ``old_log_probs`` | ``old_logprobs`` |
| ``advantages`` | ``advantages`` |
| ``response_mask`` | ``response_mask`` |
| the model output's ``entropy`` (or ``rlstab_old_entropy``, kept by the step scope) | ``entropy`` |
| ``rollout_is_weights`` (``algorithm.rollout_correction``) | ``is_weights`` |
"""

from __future__ import annotations

from rlstab.batch import TokenBatch
from rlstab.lazy import torch


def token_batch(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> TokenBatch:
    """One veRL micro-batch, in the names of verl's policy-loss call."""
    return TokenBatch(
        logprobs=log_prob,
        response_mask=response_mask,
        old_logprobs=old_log_prob,
        advantages=advantages,
        entropy=entropy,
        is_weights=rollout_is_weights,
    )


def token_batch_of(data, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> TokenBatch:
    """A mini-batch of ``TrainingWorker`` (``data``), with the current policy's ``logprobs`` and ``entropy``."""
    return token_batch(
        log_prob=logprobs,
        old_log_prob=data["old_log_probs"],
        advantages=data["advantages"],
        response_mask=data["response_mask"],
        entropy=entropy,
        rollout_is_weights=field(data, "rollout_is_weights"),
    )


def field(data, key: str):
    """``data[key]``, or None when the mini-batch has no such key."""
    return data[key] if key in data.keys() else None
