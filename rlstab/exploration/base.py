"""Bases of the exploration families: ``rollout:`` (executed by a trainer) and ``dual_stream:`` (in the loss)."""

from __future__ import annotations

from typing import ClassVar

from rlstab.components import Component


class Rollout(Component):
    """Base of ``rollout:`` components: how a trainer generates rollouts.

    The loss never runs it; a trainer that can execute the kind does (rlstab's embedded trainer
    calls ``explorer(seed)`` for a runtime with the interface of
    [`PivotExplorer`][rlstab.exploration.deep_grpo.PivotExplorer]); the adapters refuse ``rollout:``.
    """

    def explorer(self, seed: int):
        """The runtime that chooses pivots and learns from their branches, seeded."""
        raise NotImplementedError


class StreamWeighting(Component):
    """Base of ``dual_stream:`` components: rows marked ``TokenBatch.is_branch`` form a second stream,
    aggregated on its own and added with weight ``branch_weight`` (a float field every subclass has)."""

    reads: ClassVar[frozenset[str]] = frozenset({"is_branch"})
