"""A stateful reweighter of the tests' own whose step value comes from its state alone (``value_from_state``).

No preset that veRL's or OpenRLHF's per-micro-batch modes accept has such a state: adaptive entropy
is refused there, as both trainers add their own entropy bonus. A third-party controller can have
one, so the adapters' tests register this one in each rank. The tests then check, through the real
trainers, that the mode adds up its measure over every micro-batch of the optimizer step (and every
rank, where the mode gathers over ranks) and moves the state once per step.

Measure: the mean surprisal ``-log pi_old`` over the step's valid tokens. Value: the factor
``1 + surprisal / 10`` of the last measurement, 1 before the first, on every token of the step.
The state also counts the steps measured.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch

from rlstab.components import ComponentState
from rlstab.reweighters import Reweighter

KIND = "surprisal_controller"


class SurprisalControllerState(ComponentState):
    scale: float
    surprisal: float | None
    steps: int


class SurprisalController(Reweighter):
    """Scale every token's loss by ``1 + s_(k-1) / 10``, ``s_(k-1)`` the previous step's mean -log pi_old."""

    kind: Literal["surprisal_controller"] = KIND
    state_model: ClassVar[type[ComponentState]] = SurprisalControllerState

    def value_from_state(self) -> bool:
        return True

    def step_sums(self, t) -> torch.Tensor:
        total = torch.where(t.valid_bool, t.old_logprobs.neg(), 0.0).to(torch.float64).sum()
        return torch.stack([total, t.valid.to(torch.float64).sum()])

    def initial_state(self) -> dict[str, Any]:
        return {"scale": 1.0, "surprisal": None, "steps": 0}

    def begin_step(self, sums, state):
        state = dict(self.initial_state() if state is None else state)
        value = state["scale"]
        if sums is not None:
            total, count = sums.tolist()
            if count > 0:
                state["surprisal"] = total / count
                state["scale"] = 1.0 + state["surprisal"] / 10.0
            state["steps"] += 1
        return value, state

    def weights(self, t, step) -> torch.Tensor:
        return torch.full((t.old_logprobs.shape[0], 1), float(step), dtype=torch.float32, device=t.old_logprobs.device)

    def step_metrics(self, step) -> dict[str, float]:
        return {"scale": float(step)}

    def describe(self) -> str:
        return "surprisal_controller: weight 1 + s_(k-1)/10, s = -mean log p_old over the step's valid tokens"


def register() -> None:
    """Register the kind in this process (each spawned rank calls it before the trainer reads its objective)."""
    import rlstab

    rlstab.register(SurprisalController)
