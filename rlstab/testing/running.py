"""Running a compiled objective the way a trainer does: a loss and its gradients, a step of micro-batches.

Gradients are returned by field (``{"logprobs": ..., "entropy": ...}``), each over the whole batch,
zeros where the loss does not depend on the field.
"""

from __future__ import annotations

from rlstab.batch import LossOutput, TokenBatch
from rlstab.lazy import torch
from rlstab.testing.batches import leaves, take


def gradients(leaves: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for name, leaf in leaves.items()}


def loss_and_grad(loss_fn, batch: TokenBatch, step=None) -> tuple[LossOutput, dict[str, torch.Tensor]]:
    """The loss of ``batch`` (its own step when ``step`` is None) and its gradients."""
    leaf = leaves(batch)
    out = loss_fn(take(batch, 0, batch.response_mask.shape[0], leaf), step=step)
    assert isinstance(out, LossOutput), f"the loss returned {type(out).__name__}, not a LossOutput"
    assert out.loss.dim() == 0, f"the loss has shape {tuple(out.loss.shape)}, not a scalar"
    out.loss.backward()
    return out, gradients(leaf)


def run_step(loss_fn, batch: TokenBatch, bounds) -> tuple[object, float, dict[str, torch.Tensor], list[LossOutput]]:
    """One step of ``batch`` split at ``bounds`` (``[(lo, hi), ...]``): gather, then each micro-batch's loss.

    Returns ``(stats, summed loss, gradients over the whole batch, each micro-batch's LossOutput)``.
    """
    leaf = leaves(batch)
    micro = [take(batch, lo, hi, leaf) for lo, hi in bounds]
    stats = loss_fn.gather(micro)
    outs = []
    total = torch.zeros((), dtype=torch.float64)
    for mb in micro:
        out = loss_fn(mb, step=stats)
        out.loss.backward()
        total += out.loss.detach().to(torch.float64)
        outs.append(out)
    return stats, total.item(), gradients(leaf), outs
