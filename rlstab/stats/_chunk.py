"""The per-chunk arithmetic of [`token_stats_from_logits`][rlstab.stats.token_stats_from_logits]
(forward and backward) and [`token_stats`][rlstab.stats.token_stats] (backward).

A chunk is ``c`` tokens' logits (``[c, V]``, or a tile ``[c, v]`` of the vocabulary in backward;
float32 or float64), held in a buffer the caller owns and lets these functions overwrite: every
pass below runs in place on cache-sized memory, so a chunk costs a handful of passes over its
numbers and no allocation of that size.

Base 2. The buffer holds the logits in bits, ``z = log2(e) * logits / T``, because ``exp2`` is
accurate to an ulp and about three times faster than ``exp`` on CPU (both vectorised); the
conversion costs nothing, since callers fold ``log2(e) / T`` into what they multiply anyway
(the hidden states, or the copy of the logits). Results are converted back to nats.

Forward, for each token (row), with ``m = max_v z_v`` and ``z' = z - m``::

    S = sum_v 2^z'_v                 lse = ln2 (m + log2 S)
    logprob = ln2 (z'_y - log2 S)    entropy = ln2 (log2 S - sum_v 2^z'_v z'_v / S)

(``entropy = lse - sum_v p_v logits_v`` written with the shifted logits, so that no term is of the
size of ``m``: float32 rounding stays relative to the spread of the logits, not their offset.)

Backward, with ``p = 2^(z - lse / ln2)`` and upstream gradients ``g`` (log-prob) and ``gH``
(entropy), the gradient with respect to the (temperature-scaled) logits::

    d logprob / dlogit_v = onehot_y(v) - p_v
    d entropy / dlogit_v = -p_v (log p_v + entropy)
    G_v = g onehot_y(v) - p_v (g + gH (log p_v + entropy))
"""

from __future__ import annotations

import math

from rlstab.lazy import torch

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when an input is float64 (exact references), otherwise float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def forward_chunk(z: torch.Tensor, labels: torch.Tensor, e: torch.Tensor):
    """``(lse, logprob, entropy, sum_v 2^(z_v - max z))`` of each row of ``z`` (in bits; results in nats).

    Overwrites ``z`` and ``e`` (a scratch buffer shaped like ``z``). ``labels`` must be valid
    indices (the caller maps ignored labels to 0 and zeroes their log-probabilities afterwards).
    """
    m = z.amax(-1, keepdim=True)
    z.sub_(m)
    picked = z.gather(1, labels.unsqueeze(1)).view(-1)
    torch.exp2(z, out=e)
    total = e.sum(-1)
    log2_total = total.log2()
    weighted = z.mul_(e).sum(-1)  # sum_v 2^z'_v z'_v, in place: z is not needed any more
    entropy = (log2_total - weighted / total).mul_(LN2).clamp_(min=0.0)  # rounding may dip below 0
    logprob = (picked - log2_total).mul_(LN2)
    return (m.view(-1) + log2_total).mul_(LN2), logprob, entropy, total


def backward_chunk(
    z: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad_logprob: torch.Tensor,
    entropy: torch.Tensor | None = None,
    grad_entropy: torch.Tensor | None = None,
    e: torch.Tensor | None = None,
    grad_label: torch.Tensor | None = None,
) -> torch.Tensor:
    """Turn the recomputed logits ``z`` (in bits) into the gradient with respect to the logits, in place.

    ``z`` may be a tile of the vocabulary (columns ``[v0, v1)``): ``labels`` are then indices
    within the tile and ``grad_label`` is ``grad_logprob`` where the label falls in the tile and 0
    elsewhere (None: every label is in ``z``). ``grad_logprob`` is zero on ignored tokens. With
    ``grad_entropy`` (and ``entropy``, and a scratch buffer ``e`` shaped like ``z``) the entropy's
    gradient is added. Returns ``z``.
    """
    z.sub_((lse * LOG2E).unsqueeze(1))  # log2 p
    if grad_entropy is None:
        z.exp2_().mul_(grad_logprob.neg().unsqueeze(1))  # -g p
    else:
        # log p below -1000 has p = 0 exactly in float32 and float64; the floor keeps the product
        # below finite (masked logits: the lowest float times gH could overflow to inf, and 0 * inf = NaN).
        z.mul_(LN2).clamp_(min=-1000.0)  # log p
        p = torch.exp(z, out=e)
        # -p (g + gH (log p + H))
        z.add_(entropy.unsqueeze(1)).mul_(grad_entropy.unsqueeze(1)).add_(grad_logprob.unsqueeze(1))
        z.mul_(p).neg_()
    onehot = grad_logprob if grad_label is None else grad_label
    z.scatter_add_(1, labels.unsqueeze(1), onehot.unsqueeze(1).to(z.dtype))
    return z
