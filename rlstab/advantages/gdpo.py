"""GDPO: each reward dimension normalised within its group apart, then combined and whitened over the step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlstab.advantages.base import AdvantageEstimator, GroupTable, zero_padding_rows
from rlstab.advantages.reinforce_pp import whitening_stats
from rlstab.batch import BatchError
from rlstab.lazy import torch

_COLUMN = "reward_{}"  # sequence_inputs' name of column k of TokenBatch.reward_components


@dataclass(frozen=True)
class GDPOState:
    """One group table per reward dimension, and the step's whitening mean and variance of their weighted sum."""

    tables: tuple[GroupTable, ...]
    mean: torch.Tensor
    var: torch.Tensor


class GDPO(AdvantageEstimator):
    r"""Group reward-Decoupled normalization Policy Optimization (GDPO, Liu et al., arXiv 2601.05242).

    $$A^{(k)}_i = \frac{r^{(k)}_i - \operatorname{mean}_g r^{(k)}}{\operatorname{std}_g r^{(k)} + \epsilon},\qquad
      S_i = \sum_k w_k A^{(k)}_i,\qquad A_i = \frac{S_i - \mu}{\sqrt{\sigma^2 + 10^{-8}}}$$

    With several rewards (format, accuracy, length, ...), GRPO normalises their sum, so groups
    with different reward combinations collapse onto the same advantages; GDPO normalises each
    dimension k within the prompt's group g on its own (GRPO's advantage, unbiased std, a group
    of one: mean 0, std 1), sums them with weights ``w_k``, and whitens the sum over every valid
    token of the step (mu and sigma^2 weight each response by its length, unbiased: veRL's
    ``masked_whiten``, as ``reinforce_pp``).

    **Where the dimensions come from**: ``TokenBatch.reward_components`` ``[B, K]`` (``source:
    reward_components``, the default). veRL 0.9.1's ``compute_gdpo_outcome_advantage`` reads them
    from the batch's non-tensor entries named by ``algorithm.gdpo_reward_keys`` (the per-sample
    dict the reward function returns), weights ``algorithm.gdpo_reward_weights``; an adapter or
    trainer puts those columns, in that order, into ``reward_components``. ``rewards`` stays the
    scalar reward, which GDPO does not read (``reward_shaping`` terms, added to ``rewards``, do
    not reach it either: shape a dimension instead). ``source: rewards`` takes ``rewards`` as the
    only dimension, veRL's fallback without reward keys (GRPO's advantage, whitened).

    Defaults, from the authors' code (github NVlabs/GDPO, ``verl-GDPO/verl/trainer/ppo/ray_trainer.py``:
    two dimensions, each ``compute_grpo_outcome_advantage``, summed, ``masked_whiten``) and veRL's:
    weights 1 (``weights`` null), std division on (``norm_adv_by_std_in_grpo``), ``eps`` 1e-6.
    Step scope: the group tables and the whitening span every micro-batch and rank of the step
    (veRL's, its training batch). Padding rows count nowhere and get A = 0; their components may
    hold anything.

    TRL 1.16's ``multi_objective_aggregation="normalize_then_sum"`` is the same idea computed
    differently: 1e-4 added to every std (not 1e-6, and not under the square root) and the final
    normalisation over responses, each weighing 1 (not over tokens); it is not one of these options.
    """

    kind: Literal["gdpo"] = "gdpo"
    source: Literal["reward_components", "rewards"] = "reward_components"
    """The reward dimensions: the columns of ``TokenBatch.reward_components``, or ``rewards`` alone."""
    weights: list[Annotated[float, Field(ge=-1e6, le=1e6)]] | None = None
    """``w_k``, one per dimension (veRL's ``gdpo_reward_weights``); null: 1 each."""
    normalize_std: bool = True
    """Divide each dimension's centred reward by its group std + eps (veRL's ``norm_adv_by_std_in_grpo``)."""
    eps: float = Field(1e-6, ge=0.0, le=1.0)
    """Added to each group std."""
    whiten_eps: float = Field(1e-8, ge=0.0, le=1.0)
    """Added to the whitening variance (``masked_whiten``'s 1e-8)."""

    @model_validator(mode="after")
    def _check(self):
        if self.weights is not None and not self.weights:
            raise ValueError("weights: give one per reward dimension, or null for 1 each")
        if self.source == "rewards" and self.weights is not None and len(self.weights) != 1:
            raise ValueError(f"source: rewards is one dimension, but {len(self.weights)} weights are given")
        return self

    @property
    def reads(self) -> frozenset[str]:  # type: ignore[override]
        extra = {"reward_components"} if self.source == "reward_components" else set()
        return frozenset({"rewards", "group_ids"} | extra)

    def _columns(self, batch) -> dict[str, torch.Tensor]:
        if self.source == "rewards":
            return {}
        components = batch.reward_components
        K = components.shape[1]
        if self.weights is not None and K != len(self.weights):
            raise BatchError(
                f"advantage (gdpo): TokenBatch.reward_components has {K} columns, but {len(self.weights)} weights are given"
            )
        return {_COLUMN.format(k): components[:, k].to(torch.float32) for k in range(K)}

    def sequence_inputs(self, t) -> dict[str, torch.Tensor]:
        """Each reward dimension of one micro-batch, ``reward_<k>`` ``[B]`` (none with ``source: rewards``)."""
        return self._columns(t.batch)

    def _dimensions(self, rewards, columns: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        if self.source == "rewards":
            return [rewards.to(torch.float32)]
        return [columns[_COLUMN.format(k)] for k in range(len(columns))]

    def _combined(self, tables, dimensions, group_ids, responses) -> torch.Tensor:
        weights = self.weights or (1.0,) * len(dimensions)
        total = torch.zeros(group_ids.shape, device=group_ids.device)
        for w, table, r in zip(weights, tables, dimensions):
            mean, std, _ = table.rows(group_ids, responses)
            centred = r - mean
            total = total + w * (centred / (std + self.eps) if self.normalize_std else centred)
        return total

    def fit(self, rewards, group_ids, lengths, responses=None, **columns):
        dimensions = self._dimensions(rewards, columns)
        if not dimensions:
            raise BatchError("advantage (gdpo): TokenBatch.reward_components has no column (K = 0)")
        tables = tuple(GroupTable.fit(r, group_ids, responses) for r in dimensions)
        mean, var = whitening_stats(self._combined(tables, dimensions, group_ids, responses), lengths, responses)
        return GDPOState(tables, mean, var)

    def apply(self, stats: GDPOState, rewards, group_ids, responses=None):
        if self.source != "rewards":
            raise BatchError("advantage (gdpo): each response's reward_components are needed; call micro_batch_advantages")
        combined = self._combined(stats.tables, [rewards.to(torch.float32)], group_ids, responses)
        return zero_padding_rows((combined - stats.mean) * torch.rsqrt(stats.var + self.whiten_eps), responses)

    def micro_batch_advantages(self, stats: GDPOState, t, rewards, group_ids, responses=None):
        dimensions = self._dimensions(rewards, self._columns(t.batch))
        if len(dimensions) != len(stats.tables):
            raise BatchError(
                f"advantage (gdpo): this micro-batch has {len(dimensions)} reward dimensions, the step had {len(stats.tables)}"
            )
        combined = self._combined(stats.tables, dimensions, group_ids, responses)
        return zero_padding_rows((combined - stats.mean) * torch.rsqrt(stats.var + self.whiten_eps), responses)

    def describe(self) -> str:
        source = "the columns of reward_components" if self.source == "reward_components" else "rewards alone"
        weights = "1 each" if self.weights is None else ", ".join(f"{w:g}" for w in self.weights)
        per_dim = f"(r_k - mean_g r_k) / (std_g r_k + {self.eps:g})" if self.normalize_std else "r_k - mean_g r_k"
        return (f"gdpo: A_i = whiten(sum_k w_k {per_dim}) over the step's valid tokens, r_k = {source}, "
                f"w = {weights}")
