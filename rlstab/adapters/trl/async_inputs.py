"""TRL's packed AsyncGRPO micro-batch as a [`TokenBatch`][rlstab.TokenBatch]: the only place its tensor names appear.

``AsyncGRPOTrainer`` does not pad completions into ``[B, T]``. Its collator folds one rank's
samples into a prefix tree (``packing.TreeRow``), forwards each shared token once, and hands
``compute_loss`` a flat list of the ``M`` trained tokens: which packed position predicts each
(``token_index``), the sampler's log-probability and the advantage of each, and which sample it
belongs to (``segment_id``, 0 .. S-1 in this rank's row). A sample's tokens are consecutive in
that list, in order (``TreeRow.pack``), so token ``m`` is column ``m - first(segment_id[m])`` of
row ``segment_id[m]``: the flat list is laid back out as ``[S, T]`` rows, one per sample,
padded with masked zeros (T = the longest sample's trained tokens). The loss of a masked
padding token is zero, so every aggregation sees the sample's tokens and only them, and the
gradient flows back to the flat log-probabilities through the scatter.

| TRL ``AsyncGRPOTrainer`` | rlstab |
|---|---|
| ``outputs.log_probs.flatten()[token_index]`` (forward, with grad) | ``logprobs`` |
| a trained token of the row (``token_index >= 0``) | ``response_mask`` |
| ``old_log_probs`` (the sampler's, vLLM's ``logprobs`` at sampling) | ``old_logprobs`` (``old_logprobs="sampler"``, default) or ``rollout_logprobs`` (``"proximal"``) |
| ``advantages`` (one per sample, stamped on its tokens) | ``advantages`` ``[S]`` |
| ``outputs.entropy.flatten()[token_index]`` (forward, with grad) | ``entropy``, detached unless an entropy bonus needs its gradient |
| (none: no reference model) | ``ref_logprobs`` refused |

**Which log-probabilities are "old".** The trainer keeps one log-probability per token: the
sampler's, from a policy up to ``max_staleness`` versions behind. TRL's own loss takes its ratio
against it, so by default (``"sampler"``) it is rlstab's ``old_logprobs`` and a preset's PPO clip
is TRL's. With ``"proximal"`` the ratio is instead taken against the policy being trained at the
start of the optimizer step (AReaL's proximal policy, its ``recompute_logprob``), and the
sampler's log-probabilities become ``rollout_logprobs``, so that decoupled PPO, TIS and IcePop
weight or reject each token by ``pi_prox / pi_behav``. The async trainer takes one optimizer
step per batch and the weights do not move within it, so the proximal log-probabilities are the
forward's own, detached (``old_logprobs = None``): the ratio is 1 in value, the gradient that of
``log pi``, and the trust region is the correction's band or cap alone (AReaL's decoupled loss
with one mini-batch per batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlstab.batch import TokenBatch
from rlstab.lazy import torch

TREE_KEYS = ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")


@dataclass(frozen=True)
class Packed:
    """One rank's packed micro-batch, the inter-rank padding stripped, as ``AsyncGRPOTrainer.compute_loss`` reads it.

    Attributes:
        model_inputs: the forward's keyword arguments (ids, positions, labels and the tree attention's indices).
        token_index: ``[M]`` packed position whose prediction is each trained token.
        sampler_logprobs: ``[M]`` the sampler's log-probability of each trained token.
        advantages: ``[M]`` each token's sample's advantage.
        segment_id: ``[M]`` the sample (row) each trained token belongs to.
    """

    model_inputs: dict[str, Any]
    token_index: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    segment_id: torch.Tensor


def unpack(inputs: dict[str, Any]) -> Packed:
    """The micro-batch dict of ``AsyncGRPOTrainer``'s collator, as its ``compute_loss`` unpacks it."""
    mask = inputs["attention_mask"].bool()
    selected = inputs["token_index"] >= 0
    model_inputs = {
        "input_ids": inputs["input_ids"][mask].unsqueeze(0),
        "position_ids": inputs["position_ids"][mask].unsqueeze(0),
        "shift_labels": inputs["shift_labels"][mask].unsqueeze(0),
        **{key: inputs[key][inputs[key] >= 0] for key in TREE_KEYS},
    }
    model_inputs["tree_max_seqlen_q"], model_inputs["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()
    return Packed(
        model_inputs=model_inputs,
        token_index=inputs["token_index"][selected],
        sampler_logprobs=inputs["old_log_probs"][selected],
        advantages=inputs["advantages"][selected],
        segment_id=inputs["segment_id"][selected],
    )


def forward(model, packed: Packed, aux: bool = False):
    """TRL's fused forward: per-token log-probabilities and entropies of the trained tokens ``[M]``, and the MoE aux loss."""
    router = {"output_router_logits": True} if aux else {}
    outputs = model(**packed.model_inputs, fused_lm_head=True, **router)
    log_probs = outputs.log_probs.flatten()[packed.token_index]
    entropy = outputs.entropy.flatten()[packed.token_index]
    return log_probs, entropy, (outputs.aux_loss if aux else None)


def token_batch(
    packed: Packed,
    log_probs: torch.Tensor,
    entropy: torch.Tensor | None,
    *,
    old_logprobs: str = "sampler",
    entropy_grad: bool = False,
) -> TokenBatch:
    """One rank's packed micro-batch as a ``[S, T]`` [`TokenBatch`][rlstab.TokenBatch], one row per sample.

    Args:
        packed: the micro-batch, [`unpack`][rlstab.adapters.trl.async_inputs.unpack]ed.
        log_probs: ``[M]`` current log-probabilities of the trained tokens, with grad.
        entropy: ``[M]`` current entropies (TRL's fused head computes them with grad), or None.
        old_logprobs: ``"sampler"``: the sampler's log-probabilities are ``old_logprobs`` (TRL's
            ratio); ``"proximal"``: ``old_logprobs`` is None (the forward's own, detached) and the
            sampler's are ``rollout_logprobs``.
        entropy_grad: keep the entropy's gradient (an ``entropy_bonus`` needs it).
    """
    rows, cols, shape = layout(packed.segment_id)
    device = log_probs.device

    def scatter(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(shape, dtype=values.dtype, device=device).index_put((rows, cols), values)

    mask = torch.zeros(shape, dtype=torch.bool, device=device).index_put(
        (rows, cols), torch.ones_like(rows, dtype=torch.bool)
    )
    advantages = torch.zeros(shape[0], dtype=torch.float32, device=device).index_put(
        (rows,), packed.advantages.float()
    )
    sampler = scatter(packed.sampler_logprobs.float())
    ent = None
    if entropy is not None:
        ent = scatter(entropy if entropy_grad else entropy.detach())
    return TokenBatch(
        logprobs=scatter(log_probs),
        response_mask=mask,
        old_logprobs=sampler if old_logprobs == "sampler" else None,
        advantages=advantages,
        entropy=ent,
        rollout_logprobs=sampler if old_logprobs == "proximal" else None,
    )


def layout(segment_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """Row and column of each flat trained token, and the ``(S, T)`` shape: one row per sample, its tokens in order."""
    device = segment_id.device
    if segment_id.numel() == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty, (1, 1)
    rows = segment_id.long()
    counts = torch.bincount(rows)
    first = torch.cumsum(counts, 0) - counts
    cols = torch.arange(rows.numel(), device=device) - first[rows]
    return rows, cols, (int(counts.numel()), max(int(counts.max()), 1))
