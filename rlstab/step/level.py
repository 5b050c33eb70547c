"""What the step-level components decide once per step, and how the compiled objective applies it.

Used by [`CompiledObjective`][rlstab.CompiledObjective]: ``fit_step_level`` runs first in
``gather`` (before advantages, hooks and mask thresholds); its [`StepLevel`][rlstab.step.StepLevel]
travels in ``StepStats`` and is applied again to every micro-batch of the loss phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlstab.batch import BatchError, TokenBatch
from rlstab.comm import Comm
from rlstab.lazy import torch
from rlstab.tokens import Tokens


def shaped_rewards(objective, batch: TokenBatch) -> torch.Tensor:
    """``batch.rewards`` plus every ``reward_shaping`` term of ``objective`` (float32)."""
    rewards = batch.rewards.to(torch.float32)
    if objective.reward_shaping:
        lengths = batch.response_mask.sum(-1)
        for shaping in objective.reward_shaping:
            rewards = rewards + shaping.penalty(lengths)
    return rewards


@dataclass(frozen=True)
class StepLevel:
    """Step-level decisions, frozen for the step.

    Attributes:
        dropped_groups: sorted group ids whose responses dynamic sampling turned into padding, or None.
        lr_scale: the factor for this step's learning rate (VCPO's ESS scale; 1.0 without one).
        ess: the effective sample size behind ``lr_scale``, or None.
        responses: B of the ESS, the step's responses with valid tokens (0 without an ESS scale).
        groups: the step's number of groups seen by the group filter (0 without one).
    """

    dropped_groups: torch.Tensor | None = None
    lr_scale: float = 1.0
    ess: float | None = None
    responses: int = 0
    groups: int = 0

    def kept_rows(self, batch: TokenBatch) -> torch.Tensor | None:
        """``[B]`` bool: the responses the group filter keeps, or None when it drops nothing."""
        if self.dropped_groups is None or self.dropped_groups.numel() == 0:
            return None
        dropped = self.dropped_groups.to(batch.group_ids.device)
        return ~torch.isin(batch.group_ids.to(torch.int64), dropped)

    def restrict(self, t: Tokens) -> None:
        """Turn the dropped responses of ``t`` into padding."""
        rows = self.kept_rows(t.batch)
        if rows is not None:
            t.valid = t.valid * rows.unsqueeze(-1).to(t.valid.dtype)
            t.valid_bool = t.valid_bool & rows.unsqueeze(-1)

    def response_tokens(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, T]`` float: response tokens of the kept responses (valid before rollout rejection)."""
        mask = batch.response_mask
        rows = self.kept_rows(batch)
        if rows is not None:
            mask = mask & rows.unsqueeze(-1)
        return mask.to(torch.float32)

    def metrics(self, objective) -> dict[str, float]:
        out = {}
        if objective.group_filter is not None:
            dropped = 0 if self.dropped_groups is None else self.dropped_groups.numel()
            out["step/groups_dropped"] = float(dropped)
            out["step/groups_dropped_fraction"] = dropped / max(self.groups, 1)
        if objective.lr_scale is not None:
            out["step/lr_scale"] = self.lr_scale
            out["step/ess"] = float(self.ess)
            out["step/ess_fraction"] = float(self.ess) / max(self.responses, 1)
        return out


def fit_step_level(objective, tokens: list[Tokens], comm: Comm) -> StepLevel:
    """Apply the step-level components to the step's ``tokens`` (in place) and return their decisions."""
    if objective.reward_shaping and any(t.batch.advantages is not None for t in tokens):
        kinds = ", ".join(s.kind for s in objective.reward_shaping)
        raise BatchError(
            f"reward_shaping ({kinds}) shapes the rewards the objective estimates advantages from, but the batch "
            "carries advantages: shape the rewards in the trainer (rlstab.step.overlong_penalty) or drop advantages"
        )
    dropped, groups = None, 0
    flt = objective.group_filter
    if flt is not None and tokens:
        shaped = flt.judges_shaped_rewards()
        rewards = [shaped_rewards(objective, t.batch) if shaped else t.batch.rewards for t in tokens]
        # Each response's reward and whether it has a response token (padding rows leave the groups), in one concatenation.
        rows = comm.cat(torch.cat([
            torch.stack([r.to(torch.float32), t.batch.response_mask.any(-1).to(torch.float32)], -1).reshape(-1)
            for r, t in zip(rewards, tokens)
        ])).reshape(-1, 2)
        group_ids = comm.cat(torch.cat([t.batch.group_ids.to(torch.int64) for t in tokens]))
        dropped, groups = flt.dropped_groups(rows[:, 0], group_ids, rows[:, 1] > 0)
    level = StepLevel(dropped_groups=dropped, groups=groups)
    for t in tokens:
        level.restrict(t)
    scale = objective.lr_scale
    if scale is None or not tokens:
        return level
    log_weights = comm.cat(torch.cat([scale.log_weights(t) for t in tokens]))
    factor, ess = scale.scale(log_weights)
    return StepLevel(dropped_groups=dropped, groups=groups, lr_scale=factor, ess=ess, responses=log_weights.numel())
