"""The per-chunk arithmetic shared by [`token_stats`][rlstab.stats.token_stats] and
[`token_stats_from_logits`][rlstab.stats.token_stats_from_logits].

A chunk is ``c`` tokens' logits ``z`` ([c, V], float32 or float64, already divided by the
temperature), held in a buffer the caller owns and lets these functions overwrite: every pass
below runs in place on cache-sized memory, so a chunk costs a handful of passes over ``c * V``
numbers and no allocation of that size.

Forward, for each token (row), with ``m = max_v z_v`` and ``z' = z - m``::

    S = sum_v exp(z'_v)              lse = m + log S
    logprob = z'_y - log S           entropy = log S - sum_v exp(z'_v) z'_v / S

(``entropy = lse - sum_v p_v z_v`` written with the shifted logits, so that no term is of the size
of ``m``: the float32 rounding stays relative to the spread of the logits, not their offset.)

Backward, with ``log p = z - lse`` and upstream gradients ``g`` (log-prob) and ``gH`` (entropy)::

    d logprob / dz_v = onehot_y(v) - p_v
    d entropy / dz_v = -p_v (log p_v + entropy)
    G_v = g onehot_y(v) - p_v (g + gH (log p_v + entropy))
"""

from __future__ import annotations

import torch


def forward_chunk(z: torch.Tensor, labels: torch.Tensor, e: torch.Tensor):
    """``(lse, logprob, entropy, sum_v exp(z_v - max z))`` of each row of ``z`` ([c] each).

    Overwrites ``z`` with ``z - max z`` and ``e`` with its exponential.

    ``labels`` must be valid indices (the caller maps ignored labels to 0 and zeroes their
    log-probabilities afterwards). ``e`` is a scratch buffer shaped like ``z``.
    """
    m = z.amax(-1, keepdim=True)
    z.sub_(m)
    torch.exp(z, out=e)
    total = e.sum(-1)
    log_total = total.log()
    # sum_v e_v z'_v as a batch of row dot products: no [c, V] product is written.
    weighted = torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).view(-1)
    entropy = (log_total - weighted / total).clamp_(min=0.0)  # >= 0 exactly; rounding may dip below
    logprob = z.gather(1, labels.unsqueeze(1)).view(-1) - log_total
    return m.view(-1) + log_total, logprob, entropy, total


def backward_chunk(
    z: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad_logprob: torch.Tensor,
    entropy: torch.Tensor | None = None,
    grad_entropy: torch.Tensor | None = None,
    e: torch.Tensor | None = None,
) -> torch.Tensor:
    """Turn the recomputed logits ``z`` into the gradient with respect to them, in place; returns ``z``.

    ``grad_logprob`` is zero on ignored tokens. With ``grad_entropy`` (and ``entropy``, and a
    scratch buffer ``e``) the entropy's gradient is added.
    """
    z.sub_(lse.unsqueeze(1))  # log p
    if grad_entropy is None:
        z.exp_().mul_(grad_logprob.neg().unsqueeze(1))  # -g p
    else:
        p = torch.exp(z, out=e)
        # -p (g + gH (log p + H))
        z.add_(entropy.unsqueeze(1)).mul_(grad_entropy.unsqueeze(1)).add_(grad_logprob.unsqueeze(1))
        z.mul_(p).neg_()
    z.scatter_add_(1, labels.unsqueeze(1), grad_logprob.unsqueeze(1).to(z.dtype))
    return z
