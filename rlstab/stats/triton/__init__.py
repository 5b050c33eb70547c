"""Fused Triton kernels behind ``token_stats_from_logits`` for CUDA tensors.

Importing this package imports Triton: ``rlstab.stats`` imports it only when CUDA logits arrive
(and Triton is installed), or a test asks for it. The kernels (``kernels``) compute, per token,
in one read of the logits in float32 and base 2, what the CPU path computes chunk by chunk::

    z_v = max(log2(e) logit_v / T, lowest float32)      m = max_v z_v     S = sum_v 2^(z_v - m)
    lse = ln2 (m + log2 S)    logprob = ln2 (z_y - m - log2 S)
    entropy = ln2 (log2 S - sum_v 2^(z_v - m) (z_v - m) / S)

and in backward, in one more read of the logits and one write of the gradient in their dtype::

    G_v = (g onehot_y(v) - p_v (g + gH (log p_v + entropy))) / T

``token_stats_from_logits_triton`` runs them on whatever tensors it is given (CPU tensors under
Triton's interpreter, ``TRITON_INTERPRET=1`` set before this package is imported).
"""

from rlstab.stats.triton.function import BLOCK_V, NUM_WARPS, token_stats_from_logits_triton

__all__ = ["BLOCK_V", "NUM_WARPS", "token_stats_from_logits_triton"]
