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
        torch.stack([t.valid_rows(), responses(t.batch).to(torch.float32)], -1).reshape(-1) for t in tokens
    ])).reshape(-1, 2)
    lengths, has_tokens = rows[:, 0], rows[:, 1] > 0
    parts = [est.sequence_inputs(t) for t in tokens]
    inputs = {name: step_values([p[name] for p in parts], comm, len(rewards)) for name in (parts[0] if parts else {})}
    state = est.fit(rewards, group_ids, lengths, has_tokens, **inputs)
    for t in tokens:
        shaped = shaped_rewards(objective, t.batch)
        t.set_advantages(est.micro_batch_advantages(state, t, shaped, group_ids_of(t.batch), responses(t.batch)))
    return state


def step_values(values: list[torch.Tensor], comm: Comm, rows: int) -> torch.Tensor:
    """One estimator input of every micro-batch and rank, concatenated along the responses.

    ``[B]`` values give ``[N]``; ``[B, T]`` values (a token-level estimator's) give ``[N, T_max]``,
    each padded with zeros on the right to the widest ``T`` of the step (under torch.distributed a
    max over the ranks, read on the host: one synchronisation).
    """
    if values[0].dim() == 1:
        return comm.cat(torch.cat(values))
    width = max(v.shape[1] for v in values)
    if comm.distributed:
        width = int(comm.max(torch.tensor(width, device=values[0].device)))
    padded = torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values])
    return comm.cat(padded.reshape(-1)).reshape(rows, width)  # ``rows``: the step's responses, every rank's


def set_micro_batch_advantages(objective: Objective, t: Tokens, step: StepStats) -> None:
    """Set one micro-batch's advantages from the step: the fitted estimator's, or the batch's own."""
    batch = t.batch
    if step.advantage is not None:
        if batch.advantages is not None:
            raise BatchError("the step's advantages were estimated, but this micro-batch carries its own")
        rewards = shaped_rewards(objective, batch)
        t.set_advantages(objective.advantage.micro_batch_advantages(step.advantage, t, rewards, group_ids_of(batch),
                                                                    responses(batch)))
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
