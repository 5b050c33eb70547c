"""Advantages computed by the trainer."""

from __future__ import annotations

from typing import ClassVar, Literal

from rlstab.advantages.base import AdvantageEstimator


class Given(AdvantageEstimator):
    """Use the ``advantages`` the trainer put in the batch; never estimate them.

    With any other estimator, advantages present in the batch are used as they are too; ``given``
    only makes their absence an error instead of a fallback to rewards and group ids.
    """

    kind: Literal["given"] = "given"
    reads: ClassVar[frozenset[str]] = frozenset({"advantages"})

    def describe(self) -> str:
        return "given: A = the advantages the trainer supplies"
