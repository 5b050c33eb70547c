"""DEEP-GRPO's branches in the embedded trainer: continuations resampled from pivots of failed responses.

Each pivot keeps its response's first ``prefix`` tokens; its K branches are sampled from the prompt
plus that prefix (so the prefix is in the branch row's prompt and takes no gradient), at the
rollout's temperature, for the tokens the prefix leaves of the task's budget, and scored on the
whole answer (prefix and continuation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlstab.exploration.deep_grpo import PivotExplorer
from rlstab.lazy import torch
from rlstab.trainer.policy import Policy, Rollout
from rlstab.trainer.tasks import Problem, Task


@dataclass
class Branches:
    """The step's branch rows: their rollout, rewards, the prompt each descends from, its pivot, and metrics."""

    rollout: Rollout | None
    rewards: torch.Tensor
    parents: torch.Tensor
    pivot_ids: torch.Tensor
    metrics: dict[str, float]


def concat(rollouts: Sequence[Rollout], pad_id: int) -> Rollout:
    """One rollout of all rows, responses padded to the longest."""
    T = max(r.response_ids.shape[1] for r in rollouts)

    def pad(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)

    with_logprobs = all(r.logprobs is not None for r in rollouts)
    return Rollout(
        prompt_ids=[p for r in rollouts for p in r.prompt_ids],
        response_ids=torch.cat([pad(r.response_ids, pad_id) for r in rollouts]),
        response_mask=torch.cat([pad(r.response_mask, False) for r in rollouts]),
        logprobs=torch.cat([pad(r.logprobs, 0.0) for r in rollouts]) if with_logprobs else None,
    )


def sample_branches(
    explorer: PivotExplorer, sampler: Policy, rollout: Rollout, rewards: torch.Tensor, problems: Sequence[Problem],
    group_size: int, task: Task, temperature: float, generator: torch.Generator,
) -> Branches:
    """Choose pivots of the failed responses of ``rollout``, sample K branches from each, score them."""
    codec = sampler.codec
    responses = [ids[mask].tolist() for ids, mask in zip(rollout.response_ids, rollout.response_mask)]
    pivots = explorer.choose([[codec.token_text(i) for i in ids] for ids in responses], rewards.tolist())
    K = explorer.config.branches
    if not pivots:
        empty = torch.zeros(0, dtype=torch.long)
        return Branches(None, torch.zeros(0), empty, empty, explorer.observe([], torch.zeros(0, K)))
    prefixes = [responses[p.row][: p.prefix] for p in pivots]  # a prefix ends before the response's last segment
    budgets = [task.max_new_tokens - len(prefix) for prefix in prefixes]
    parts: list[Rollout] = []
    order: list[int] = []
    # One sampling call per token budget left after the prefix (every pivot's K branches at once).
    for budget in sorted(set(budgets), reverse=True):
        which = [i for i, b in enumerate(budgets) if b == budget]
        prompts = [rollout.prompt_ids[pivots[i].row] + prefixes[i] for i in which for _ in range(K)]
        parts.append(sampler.sample(prompts, max_new_tokens=budget, temperature=temperature, generator=generator))
        order += which
    position = {pivot: slot for slot, pivot in enumerate(order)}
    rows = [position[i] * K + k for i in range(len(pivots)) for k in range(K)]  # branch rows in pivot order
    branches = concat(parts, codec.pad_id).rows(rows)
    scores = [
        task.reward(problems[pivots[j // K].row // group_size], codec.decode(prefixes[j // K] + ids[mask].tolist()))
        for j, (ids, mask) in enumerate(zip(branches.response_ids, branches.response_mask))
    ]
    branch_rewards = torch.tensor(scores).reshape(len(pivots), K)
    metrics = explorer.observe(pivots, branch_rewards)
    parents = torch.tensor([p.row // group_size for p in pivots]).repeat_interleave(K)
    return Branches(branches, branch_rewards.reshape(-1), parents, torch.arange(len(pivots)).repeat_interleave(K), metrics)
