"""The argument checks the token statistics' paths share (the torch path and the Triton kernels alike)."""

from __future__ import annotations


def check_logits_arguments(logits, labels, temperature, chunk_size) -> None:
    """The argument checks of ``token_stats_from_logits``, shared by its torch and Triton paths."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = logits.shape[:-1]
    if labels is not None and labels.shape != shape:
        raise ValueError(f"labels {tuple(labels.shape)} must be logits' shape without its last dimension {tuple(logits.shape)}")
