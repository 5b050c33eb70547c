"""The loss phase: one micro-batch's share of the step loss, with the step's statistics frozen.

    L = sum_{i,t} kept_{i,t} * s_{i,t} * w_i * prod_k W^k_{i,t} * l(r_{i,t}, A_{i,t})
        + sum_k c_k * sum_{i,t} valid_{i,t} * [kept_{i,t}] * s'_{i,t} * R_k(i, t)

``kept`` is the AND of the masks over the valid tokens, ``s`` the aggregation's per-token weight
from the step's denominators (``StepCounts``; with ``dual_stream`` each stream's own, the branch
stream's times lambda), ``w`` the batch's ``is_weights``, ``W^k`` the reweighters' factors, ``l``
the surrogate, and ``s'`` the weight of the aggregation counting every valid token (with ``average:
micro_batch``, 1 / the micro-batch's valid tokens times its share of the step's responses); ``[kept]``
applies to a regulariser with ``tokens: kept``.

The policy-gradient term never builds an autograd graph: each surrogate returns its derivative in
closed form and a custom autograd function hands it to autograd, so the backward pass is a single
multiply (see ``benchmarks/loss_overhead.py``). The metrics are the next module's
([`rlstab.compiler.loss_metrics`][rlstab.compiler.loss_metrics]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlstab.aggregation import StepCounts
from rlstab.batch import TokenBatch
from rlstab.lazy import torch
from rlstab.tokens import Tokens, f32

if TYPE_CHECKING:
    from rlstab.compiler.step_stats import StepStats
    from rlstab.objective import Objective


class _PrecomputedGrad(torch.autograd.Function):
    """A scalar loss whose gradient with respect to ``logprobs`` was computed in the forward pass."""

    @staticmethod
    def forward(ctx, logprobs, value, grad):
        ctx.save_for_backward(grad)
        ctx.dtype = logprobs.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return (grad * grad_output).to(ctx.dtype), None, None


@dataclass
class LossTerms:
    """One micro-batch's loss and the parts of it that its metrics report."""

    loss: torch.Tensor
    """The loss to differentiate: the policy term (gradient in closed form) plus the regularisers'."""
    policy: torch.Tensor
    """The policy term's value."""
    surrogate_counts: dict[str, torch.Tensor]
    """The surrogate's token counts (clipped tokens), by metric name."""
    reweighted: list[torch.Tensor]
    """Per reweighter: ``sum_{i,t} kept_{i,t} * W_{i,t}``, its factor summed over the kept tokens."""
    regularisers: list[torch.Tensor]
    """Per regulariser: its aggregated value, without ``c_k``, detached."""
    n_kept: torch.Tensor
    """The micro-batch's kept tokens."""


class LossPhase:
    """The loss of one objective's micro-batches."""

    def __init__(self, objective: Objective):
        self.objective = objective
        # Regularisers average over every valid token, with the objective's aggregation kind.
        self.regulariser_aggregation = objective.aggregation.model_copy(update={"count": "valid"})

    def terms(self, batch: TokenBatch, t: Tokens, step: StepStats, kept: torch.Tensor) -> LossTerms:
        """The loss of a micro-batch whose tokens ``t`` carry their advantages; ``kept``: the tokens every mask keeps."""
        obj = self.objective
        agg = obj.aggregation
        row_tokens = None
        if agg._reads_row_tokens:
            row_tokens = t.valid_rows() if agg.count == "valid" or kept is t.valid else kept.sum(-1)
        weight = kept * _scale(obj, agg, step, t, row_tokens)
        if batch.is_weights is not None:
            w = f32(batch.is_weights)
            weight = weight * (w.unsqueeze(-1) if w.dim() == 1 else w)
        reweighted = []
        for reweighter, value in zip(obj.reweighters, step.hooks):
            factor = reweighter.weights(t, value)  # [B, T] or [B, 1]; None: all 1
            if factor is None:  # x * 1 is x: the same weight, and the kept tokens' sum of ones is their count
                reweighted.append(None)
                continue
            weight = weight * factor
            reweighted.append((kept * factor).sum())
        result = obj.surrogate.evaluate(t, weight, step.hooks[len(obj.reweighters)])
        loss = result.loss
        if batch.logprobs.requires_grad:
            loss = _PrecomputedGrad.apply(batch.logprobs, result.loss, result.grad)
        regularisers = []
        if obj.regularisers:
            reg_agg = self.regulariser_aggregation
            row_tokens = t.valid_rows() if reg_agg._reads_row_tokens else None
            weights = {}  # (average, tokens) -> per-token weight, computed once per micro-batch
            for reg, hook in zip(obj.regularisers, step.hooks[len(obj.reweighters) + 1:]):
                key = (reg.average, reg.tokens)
                if key not in weights:
                    if reg.average == "micro_batch":
                        weight = t.valid * _micro_batch_mean(t, step.counts)
                    else:
                        weight = t.valid * _scale(obj, reg_agg, step, t, row_tokens)
                    weights[key] = weight * kept if reg.tokens == "kept" else weight
                value = (reg.term(batch, t) * weights[key]).sum()
                loss = loss + reg.coefficient(hook) * value
                regularisers.append(value.detach())
        n_kept = t.valid_count() if kept is t.valid else kept.sum()  # without masks, the valid tokens
        reweighted = [n_kept if r is None else r for r in reweighted]
        return LossTerms(loss, result.loss, result.counts, reweighted, regularisers, n_kept)


def _scale(objective: Objective, agg, step: StepStats, t: Tokens, row_tokens: torch.Tensor | None):
    """``agg``'s per-token weight; with ``dual_stream``, each stream's own, the branch stream's times lambda."""
    if step.branch_counts is None:
        return agg.scale(step.counts, row_tokens)
    main = _minus(step.counts, step.branch_counts)
    lam = objective.dual_stream.branch_weight

    def as_tensor(x):  # a float32 tensor without a host-to-device copy (a fill)
        return x if isinstance(x, torch.Tensor) else torch.full((), x, dtype=torch.float32, device=t.valid.device)

    main_scale, branch_scale = as_tensor(agg.scale(main, row_tokens)), as_tensor(agg.scale(step.branch_counts, row_tokens))
    return torch.where(t.batch.is_branch.unsqueeze(-1), lam * branch_scale, main_scale)


def _micro_batch_mean(t: Tokens, counts: StepCounts) -> torch.Tensor:
    """``average: micro_batch``'s per-token weight: 1 / the micro-batch's valid tokens, times its share of the step's
    responses (its rows with a valid token / ``sequences_valid``) and the world size (DDP averages over ranks)."""
    rows = (t.valid_rows() > 0).sum(dtype=torch.float32)
    share = rows * (counts.world_size / max(counts.sequences_valid, 1.0))
    return share / t.valid_count().clamp(min=1.0)


def _minus(total: StepCounts, part: StepCounts) -> StepCounts:
    """The denominators of the rows not in ``part`` (the main stream)."""
    return StepCounts(
        total.tokens_valid - part.tokens_valid, total.tokens_kept - part.tokens_kept,
        total.sequences_valid - part.sequences_valid, total.sequences_kept - part.sequences_kept,
        max_length=total.max_length, world_size=total.world_size,
    )
