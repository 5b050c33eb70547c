"""TRL's micro-batch as a [`TokenBatch`][rlstab.TokenBatch]: the only place TRL's tensor names appear.

``GRPOTrainer._prepare_inputs`` hands ``_compute_loss`` a dict per micro-batch; the current
policy's log-probabilities and entropies come from the loss's own forward pass:

| TRL | rlstab |
|---|---|
| ``per_token_logps`` (forward, with grad) | ``logprobs`` |
| ``completion_mask * tool_mask`` | ``response_mask`` (TRL's ``mask``) |
| ``old_per_token_logps`` (absent when on-policy) | ``old_logprobs`` (None: ``logprobs.detach()``, as TRL) |
| ``advantages`` ``[B]`` or ``[B, T]`` | ``advantages`` |
| ``entropies`` (forward, with grad) | ``entropy``, detached unless an entropy bonus needs its gradient |
| ``importance_sampling_ratio`` (vLLM correction) | ``is_weights`` |
| ``sampling_per_token_logps`` (vLLM) | ``rollout_logprobs`` |
| ``ref_per_token_logps`` (``beta != 0``) | ``ref_logprobs`` |
"""

from __future__ import annotations

from typing import Any

from rlstab.batch import TokenBatch
from rlstab.lazy import torch

# The keyword inputs TRL's _compute_loss forwards to _get_per_token_logps_and_entropies (multimodal models).
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The tokens TRL trains: completion tokens, minus tool outputs in multi-turn rollouts."""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]


def forward_kwargs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The extra model inputs of a micro-batch, as TRL passes them to its forward."""
    return {key: inputs.get(key) for key in FORWARD_KEYS}


def token_batch(
    inputs: dict[str, Any],
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor | None,
    *,
    entropy_grad: bool = False,
    is_correction: bool = False,
    rollout: bool = False,
    reference: bool = False,
) -> TokenBatch:
    """One TRL micro-batch as a [`TokenBatch`][rlstab.TokenBatch].

    Args:
        inputs: TRL's micro-batch dict.
        per_token_logps: ``[B, T]`` current log-probabilities, with grad.
        entropies: ``[B, T]`` current entropies (TRL computes them with grad).
        entropy_grad: keep the entropy's gradient (an ``entropy_bonus`` regulariser needs it);
            otherwise it is detached, so masks and metrics cost no backward work.
        is_correction: apply TRL's vLLM importance-sampling ratio as ``is_weights``
            (``use_vllm and vllm_importance_sampling_correction``, where TRL applies it).
        rollout: fill ``rollout_logprobs`` from vLLM's ``sampling_per_token_logps``. Tokens vLLM
            could not score carry NaN there; they get the old log-probability, i.e. "no mismatch",
            as TRL treats them in its own correction.
        reference: fill ``ref_logprobs`` from ``ref_per_token_logps``.
    """
    old = inputs.get("old_per_token_logps")
    advantages = inputs["advantages"]
    if advantages.dim() == 2 and advantages.shape[1] == 1 and per_token_logps.shape[1] != 1:
        advantages = advantages[:, 0]
    entropy = None
    if entropies is not None:
        entropy = entropies if entropy_grad else entropies.detach()
    is_weights = None
    if is_correction:
        is_weights = inputs["importance_sampling_ratio"]
        if is_weights.dim() == 2 and is_weights.shape[1] == 1:  # sequence_* modes: one ratio per completion
            is_weights = is_weights[:, 0]
    rollout_logprobs = None
    if rollout:
        sampled = inputs["sampling_per_token_logps"]
        fallback = per_token_logps.detach() if old is None else old
        rollout_logprobs = torch.where(torch.isnan(sampled), fallback.to(sampled.dtype), sampled)
    return TokenBatch(
        logprobs=per_token_logps,
        response_mask=loss_mask(inputs),
        old_logprobs=old,
        advantages=advantages,
        entropy=entropy,
        is_weights=is_weights,
        rollout_logprobs=rollout_logprobs,
        ref_logprobs=inputs.get("ref_per_token_logps") if reference else None,
    )
