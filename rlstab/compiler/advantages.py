"""Each token's advantage: the batch's own, or the objective's estimator, fitted once over the whole step.

The step phase fits the estimator on the shaped rewards of every micro-batch and rank
(``fit_step_advantages``); the loss phase applies that fitted state to each micro-batch
(``set_micro_batch_advantages``). A batch that carries ``advantages`` is trained on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.batch import BatchError, TokenBatch
from rlstab.comm import Comm
from rlstab.lazy import torch
from rlstab.step import shaped_rewards
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.compiler.step_stats import StepStats
    from rlstab.objective import Objective


def fit_step_advantages(objective: Objective, tokens: list[Tokens], comm: Comm) -> object | None:
    """Set every micro-batch's advantages; the estimator's fitted state, or None when the batches carry advantages."""
    given = [t.batch.advantages is not None for t in tokens]
    if all(given):
        for t in tokens:
            t.set_advantages(t.batch.advantages)
        return None
    if any(given):
        raise BatchError("some micro-batches of the step carry advantages and others do not")
    est = objective.advantage
    rewards = comm.cat(torch.cat([shaped_rewards(objective, t.batch) for t in tokens]))
    group_ids = comm.cat(torch.cat([t.batch.group_ids.to(torch.int64) for t in tokens]))
    # Per response: its valid tokens, and whether it has any response token at all (a padding row,
    # which the estimator leaves out, has none), interleaved so that one concatenation carries both.
    rows = comm.cat(torch.cat([
        torch.stack([t.valid.sum(-1), responses(t.batch).to(torch.float32)], -1).reshape(-1) for t in tokens
    ])).reshape(-1, 2)
    lengths, has_tokens = rows[:, 0], rows[:, 1] > 0
    parts = [est.sequence_inputs(t) for t in tokens]
    inputs = {name: comm.cat(torch.cat([p[name] for p in parts])) for name in (parts[0] if parts else {})}
    state = est.fit(rewards, group_ids, lengths, has_tokens, **inputs)
    for t in tokens:
        t.set_advantages(est.apply(state, shaped_rewards(objective, t.batch), group_ids_of(t.batch), responses(t.batch)))
    return state


def set_micro_batch_advantages(objective: Objective, t: Tokens, step: StepStats) -> None:
    """Set one micro-batch's advantages from the step: the fitted estimator's, or the batch's own."""
    batch = t.batch
    if step.advantage is not None:
        if batch.advantages is not None:
            raise BatchError("the step's advantages were estimated, but this micro-batch carries its own")
        rewards = shaped_rewards(objective, batch)
        t.set_advantages(objective.advantage.apply(step.advantage, rewards, group_ids_of(batch), responses(batch)))
    else:
        if batch.advantages is None:
            raise BatchError("the step was gathered from batches with advantages; this one has none")
        t.set_advantages(batch.advantages)


def responses(batch: TokenBatch) -> torch.Tensor:
    """``[B]`` bool: the responses with at least one response token; the others are padding rows."""
    return batch.response_mask.any(-1)


def group_ids_of(batch: TokenBatch) -> torch.Tensor:
    """``[B]`` int64, contiguous (``searchsorted`` copies, and warns about, a strided input)."""
    return batch.group_ids.to(torch.int64).contiguous()
