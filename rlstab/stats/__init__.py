"""Token statistics at scale: per-token log-probabilities and entropy without ``[N, V]`` logits.

- [`token_stats`][rlstab.stats.token_stats]: from the last hidden states and the LM head, in
  chunks of tokens, with a backward that recomputes each chunk's logits: the memory of a few
  chunks instead of several ``[N, V]`` tensors. On CUDA tensors the matmuls are cuBLAS's in the
  head's dtype and the softmax passes the Triton row kernels
  ([`lm_head_gpu`][rlstab.stats.lm_head_gpu]).
- [`token_stats_from_logits`][rlstab.stats.token_stats_from_logits]: from logits the trainer
  already has, in one pass, without the log-softmax copy autograd would keep: fused Triton
  kernels for CUDA logits when Triton is installed (``rlstab.stats.triton``, imported only
  then), chunked torch code on CPU, for float64, and on a GPU without Triton.

Both return the entropy detached unless asked (``entropy_grad=True``), in float32 whatever the
input dtype. The CPU path is the reference: the Triton kernels compute the same formulas and
are tested against it. Step-wide statistics of these values (exact quantiles across micro-batches and
ranks, and the approximate histogram mode) are [`rlstab.quantile`][rlstab.quantile].
"""

from rlstab.stats.from_logits import token_stats_from_logits
from rlstab.stats.lm_head import token_stats

__all__ = ["token_stats", "token_stats_from_logits"]
