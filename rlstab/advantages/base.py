"""What every advantage estimator provides.

An estimator is fitted once on the whole step — every response's reward, group id and length,
gathered from every micro-batch and rank — and then applied to each micro-batch. Group
statistics are thus exact even when a group's responses land in different micro-batches.

**Padding rows.** A response whose ``response_mask`` holds no response token is padding (a
trainer pads a micro-batch to a fixed number of rows, or a rank has fewer responses). It never
enters the step's statistics (group tables, whitening) and its advantage is 0, so its reward and
group id may hold anything — NaN, infinity, an id no other row has — and change nothing, as a
padded token changes nothing. The row is told by the response mask *before* rollout rejection
and dynamic sampling: a response that rejection empties still counts (it is data the method
chose to silence, not padding). The estimators exclude padding rows with ``torch.where`` and
weights, never boolean indexing, so this adds no host synchronisation, and no NaN reward of a
padding row can reach a sum through ``0 * NaN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlstab.batch import BatchError
from rlstab.components import Component
from rlstab.deferred import require
from rlstab.lazy import torch


@dataclass(frozen=True)
class GroupTable:
    """Per-group reward statistics of a step: sorted group ids and their mean, std and size (responses
    with response tokens; a group of padding rows only has size 0)."""

    keys: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    count: torch.Tensor

    @classmethod
    def fit(
        cls, rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor | None = None, unbiased: bool = True
    ) -> GroupTable:
        """Mean and unbiased std per group (``unbiased=False``: the population std, divided by n); a group of
        one gets mean 0 and std 1 (veRL's convention).

        ``responses``: ``[B]`` bool, False on padding rows, which are left out (None: every row counts).
        A group of padding rows only gets mean 0 and std 1 too; no response reads it.

        The sums run in float64, so any reward finite in float32 counts: squared in float32, a reward
        of 1.9e19 or more would overflow the variance to infinity and silently give its group zero
        advantages. The table is float32; a group whose std is past float32's range (rewards of
        opposite signs near 1.7e38) is refused, not given zero advantages.
        """
        keys, inverse = torch.unique(group_ids, sorted=True, return_inverse=True)  # host sync: the number of groups
        rewards = rewards.to(torch.float32).to(torch.float64)
        if responses is None:
            count = torch.bincount(inverse, minlength=keys.numel()).to(torch.float64)
        else:
            rewards = torch.where(responses, rewards, 0.0)
            count = torch.zeros(keys.numel(), dtype=torch.float64, device=rewards.device).index_add_(
                0, inverse, responses.to(torch.float64))
        total = torch.zeros_like(count).index_add_(0, inverse, rewards)
        mean = total / count
        deviation = (rewards - mean[inverse]) ** 2
        if responses is not None:
            deviation = torch.where(responses, deviation, 0.0)
        sq = torch.zeros_like(count).index_add_(0, inverse, deviation)
        std = (sq / ((count - 1) if unbiased else count).clamp(min=1)).sqrt()
        single = count <= 1  # count 0: a group of padding rows (0 / 0 above)
        mean = torch.where(single, 0.0, mean).to(torch.float32)
        std64 = torch.where(single, 1.0, std)
        std = std64.to(torch.float32)
        overflow = torch.isinf(std) & torch.isfinite(std64)  # NaN or infinite rewards stay what they were
        require(~overflow.any(), lambda: BatchError(
            f"rewards: the rewards of group {keys[overflow][0].item()} spread too far for float32 (std "
            f"{std64[overflow][0].item():.3g}, float32 holds at most 3.4e38): scale the rewards down"))
        return cls(keys=keys, mean=mean, std=std, count=count.to(torch.float32))

    def lookup(self, group_ids: torch.Tensor, responses: torch.Tensor | None = None) -> torch.Tensor:
        """Row of each id in the table; an id the step did not contain is an error (on a padding row,
        whose advantage is 0 whatever it reads, any row of the table is returned)."""
        if self.keys.numel() == 0:
            if group_ids.numel() and (responses is None or bool(responses.any())):
                raise ValueError("these group_ids were not in the step the advantages were fitted on (it had no responses)")
            return torch.full_like(group_ids, -1)  # only padding rows: see rows()
        idx = torch.searchsorted(self.keys, group_ids).clamp(max=self.keys.numel() - 1)
        found = self.keys[idx] == group_ids
        if responses is not None:
            found = found | ~responses

        def missing() -> ValueError:
            ids = group_ids[~found].unique().tolist()[:5]
            return ValueError(f"group_ids {ids} were not in the step the advantages were fitted on")

        require(found.all(), missing)  # in a deferring loss call: raised when its metrics are read
        return idx

    def rows(self, group_ids: torch.Tensor, responses: torch.Tensor | None = None, count: bool = True):
        """``(mean, std, count)`` of each response's group, ``[B]`` each (``count`` False: None for the count,
        which is then not gathered)."""
        idx = self.lookup(group_ids, responses)
        if self.keys.numel() == 0:  # padding rows of an empty step
            ones = torch.ones(group_ids.shape, device=self.mean.device)
            return torch.zeros_like(ones), ones, ones if count else None
        return self.mean[idx], self.std[idx], self.count[idx] if count else None


class AdvantageEstimator(Component):
    """Base class of advantage estimators (``advantage:`` in an objective)."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards", "group_ids"})

    def fit(
        self, rewards: torch.Tensor, group_ids: torch.Tensor, lengths: torch.Tensor, responses: torch.Tensor | None = None
    ) -> object:
        """Statistics of the whole step. ``lengths`` are each response's valid-token counts;
        ``responses`` (``[B]`` bool, None: all True) is False on padding rows, which must not count.
        An estimator whose ``sequence_inputs`` returns values also receives them here, as keywords,
        each ``[B]`` over the whole step."""
        raise NotImplementedError

    def sequence_inputs(self, t) -> dict[str, torch.Tensor]:
        """Per-response values of one micro-batch (a [`Tokens`][rlstab.tokens.Tokens]) that ``fit`` needs beyond the
        rewards, group ids and lengths, ``[B]`` each (VCPO's gradient weights), or ``[B, T]`` (a token-level
        estimator's per-position values: padded with zeros on the right to the step's widest ``T``); they are
        concatenated over every micro-batch and rank. None by default."""
        return {}

    def step_metrics(self, stats: object) -> dict[str, float]:
        """Metrics of the fitted step statistics, named without the ``advantage/<kind>/`` prefix."""
        return {}

    def apply(
        self, stats: object, rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B]`` advantages of one micro-batch's responses, 0 on padding rows (``responses`` False)."""
        raise NotImplementedError

    def micro_batch_advantages(
        self, stats: object, t, rewards: torch.Tensor, group_ids: torch.Tensor, responses: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Advantages of one micro-batch ``t`` (a [`Tokens`][rlstab.tokens.Tokens]): what the compiled loss trains on.

        ``[B]`` per response (by default ``apply``), or ``[B, T]`` per token for an estimator whose
        baseline depends on the position (the optimal token baseline), which overrides this; 0 on
        padding rows, and on padding tokens for a ``[B, T]`` result.
        """
        return self.apply(stats, rewards, group_ids, responses)


def zero_padding_rows(advantages: torch.Tensor, responses: torch.Tensor | None) -> torch.Tensor:
    """``advantages`` with 0 on padding rows (a ``where``, so a NaN computed there never leaks)."""
    return advantages if responses is None else torch.where(responses, advantages, 0.0)
