"""Base of the ``sampler:`` family: which prompts a step trains on, executed by a trainer."""

from __future__ import annotations

from rlstab.components import Component


class Sampler(Component):
    """Base of ``sampler:`` components.

    The loss never runs it; a trainer that can execute the kind does (rlstab's embedded trainer
    calls ``curriculum(seed)`` for a runtime with the interface of
    [`GoldilocksCurriculum`][rlstab.sampling.GoldilocksCurriculum]: ``pool_size``, ``choose``,
    ``observe``, ``state_dict``, ``load_state_dict``).
    """

    def curriculum(self, seed: int):
        """The runtime that chooses each step's prompts and learns from their outcomes, seeded."""
        raise NotImplementedError
