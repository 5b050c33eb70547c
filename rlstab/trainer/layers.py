"""The parts of an objective the embedded trainer executes around the loss: its sampler and its rollout.

``sampler:`` (Goldilocks) chooses each step's prompts from a candidate pool and learns from their
outcomes; ``rollout:`` (DEEP-GRPO) branches failed responses from pivots (``rlstab.trainer.branching``).
Both keep state, saved with the lab's checkpoints so that a resumed run chooses as it would have.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.trainer.tasks import Problem, Task, training_problems


class TrainerLayers:
    """The sampler and rollout runtimes of ``objective`` (None where it has none), seeded from the run's seed."""

    def __init__(self, objective: Objective, seed: int):
        self.curriculum = objective.sampler.curriculum(seed + 2) if objective.sampler is not None else None
        self.explorer = objective.rollout.explorer(seed + 3) if objective.rollout is not None else None

    def problems(self, task: Task, n: int, generator: torch.Generator) -> list[Problem]:
        """The step's ``n`` prompts: drawn uniformly, or chosen by the sampler from a pool drawn uniformly."""
        if self.curriculum is None:
            return training_problems(task, n, generator)
        pool = training_problems(task, self.curriculum.pool_size(n), generator)
        return [pool[i] for i in self.curriculum.choose([p.prompt for p in pool], n)]

    def observe(self, problems: Sequence[Problem], prompt_rates: Sequence[float]) -> dict[str, float]:
        """Hand the step's outcomes to the sampler; its metrics (empty without one)."""
        if self.curriculum is None:
            return {}
        return self.curriculum.observe([p.prompt for p in problems], prompt_rates)

    def state_dict(self) -> dict:
        return {
            "sampler": None if self.curriculum is None else self.curriculum.state_dict(),
            "rollout": None if self.explorer is None else self.explorer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state["sampler"])
        if self.explorer is not None:
            self.explorer.load_state_dict(state["rollout"])
