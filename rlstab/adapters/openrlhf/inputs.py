"""OpenRLHF's tensors as a [`TokenBatch`][rlstab.TokenBatch]: the only place OpenRLHF's tensor names appear.

Two callers hand over the same tensors: the loss, which ``ActorPPOTrainer.training_step`` calls
with OpenRLHF's names, and the step scope, which reads them from the replay buffer's
``Experience`` (with the current policy's log-probs and entropy from its no-grad forward):

| OpenRLHF | rlstab |
|---|---|
| ``log_probs`` (the current policy's; with grad in the loss) | ``logprobs`` |
| ``old_log_probs`` / ``Experience.action_log_probs`` | ``old_logprobs`` (GSPO under ``is_correction``: vLLM's, as OpenRLHF's gspo) |
| ``advantages`` | ``advantages`` |
| ``action_mask`` | ``response_mask`` |
| ``rollout_log_probs`` (vLLM's, with ``--algo.advantage.is_correction_level``) | ``rollout_logprobs`` |
| the entropy the wrapped ``Actor.forward`` attaches | ``entropy`` |
| OpenRLHF's importance-sampling coefficient ([`is_correction`][rlstab.adapters.openrlhf.is_correction]) | ``is_weights`` |

Both build their batches here, so both see the same importance weights and the same old log-probs.
"""

from __future__ import annotations

from rlstab.batch import TokenBatch
from rlstab.clipping import GSPO
from rlstab.lazy import torch


def token_batch(
    loss,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> tuple[TokenBatch, torch.Tensor | None, torch.Tensor | None]:
    """OpenRLHF's tensors as a TokenBatch for ``loss`` (an ``RlstabPolicyLoss``: its correction and surrogate).

    Returns the batch, ``vllm_kl`` and ``is_filter_ratio`` (None without correction). With the
    correction on, a GSPO objective takes its sequence ratio against vLLM's log-probabilities, as
    OpenRLHF's gspo does; other objectives get OpenRLHF's coefficient as ``is_weights``.
    """
    is_correction = loss.is_correction
    old = old_log_probs
    is_weights = vllm_kl = is_filter_ratio = None
    if is_correction.enabled:
        if rollout_log_probs is None:
            raise ValueError(f"is_correction_level={is_correction.level!r} needs rollout_log_probs, which this call lacks")
        if isinstance(loss.objective.surrogate, GSPO):
            old = rollout_log_probs
        else:
            is_weights, vllm_kl, is_filter_ratio = is_correction.weights(old_log_probs, rollout_log_probs, action_mask)
    batch = TokenBatch(
        logprobs=log_probs,
        response_mask=action_mask,
        old_logprobs=old,
        advantages=advantages,
        entropy=entropy,
        rollout_logprobs=rollout_log_probs,
        is_weights=is_weights,
    )
    return batch, vllm_kl, is_filter_ratio


def experience_batch(loss, experience, logprobs: torch.Tensor, entropy: torch.Tensor | None) -> TokenBatch:
    """An ``Experience`` of the replay buffer with the current policy's ``logprobs`` and ``entropy``, for ``loss``."""
    batch, _, _ = token_batch(
        loss,
        logprobs,
        on_device(experience.action_log_probs),
        on_device(experience.advantages),
        on_device(experience.action_mask),
        on_device(experience.rollout_log_probs),
        entropy,
    )
    return batch


def empty_batch() -> TokenBatch:
    """A micro-batch without rows, so that a rank with an empty replay buffer still enters every collective."""
    device = training_device()
    zeros = torch.zeros(0, 1, device=device)
    return TokenBatch(logprobs=zeros, response_mask=torch.zeros(0, 1, dtype=torch.bool, device=device),
                      old_logprobs=zeros, advantages=zeros, entropy=zeros)


def training_device():
    """Where ``ppo_train`` puts the experiences (``torch.cuda.current_device()``), CPU without CUDA."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def on_device(tensor):
    """A copy on the training device (the experience itself is left where it is: ``ppo_train`` moves it)."""
    return tensor.to(training_device()) if isinstance(tensor, torch.Tensor) else tensor
