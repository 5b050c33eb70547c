"""The state of an objective's stateful components (STARE's controller, BAPO's bounds), and the one
loop that takes their step: ``gather``'s begin-step and ``begin_training_batch`` alike.

Each component with step-level behaviour (every reweighter, then the surrogate, then every regulariser: the plan's
``stateful``, in ``StepStats.hooks`` order) turns the step's sums into a step value and its next
state: ``value, after = component.begin_step(component.step_totals(tokens, comm), before)``, by default
the sum over micro-batches and ranks of ``step_sums(t)`` (M2PO's cut is an order statistic instead).
A step's updates are pending until the step succeeded, so a gather that raises moves nothing.

A step taken in parts (``part_of_step``: an adapter that sees one micro-batch at a time) moves a
component whose value comes from its state alone (``value_from_state``: adaptive entropy) once,
from the sum of the parts' totals, when the next step begins (``update_state``); until then it is
the open step, which ``state_dict()`` includes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlstab.comm import Comm
from rlstab.errors import StateError
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.objective import Objective


@dataclass
class Pending:
    """The state changes of a step, applied once it succeeded."""

    moves: dict[str, tuple[object, object]] = field(default_factory=dict)
    """label -> (state before the step, state after it)."""
    parts: dict[str, object] = field(default_factory=dict)
    """label -> this part's totals, added to the open step's (``part_of_step``)."""


class ComponentStates:
    """The stateful components of one compiled objective, their states, and the step values of the
    current training batch.

    Attributes:
        components: label (``reweighters[0] (stare)``, ``surrogate (bapo)``) -> component, in
            ``StepStats.hooks`` order.
        states: label -> the component's state now (None for a stateless one).
        step_start: label -> its state before the current step's update; a later gather of the
            same step (``update_state=False``) starts from it.
        batch_values: label -> the step value ``begin_training_batch`` froze for the training
            batch's steps (components whose state moves once per training batch).
        open_step: label -> the totals so far of a step taken in parts, for the components whose
            value comes from their state alone; they move from it when the next step begins.
    """

    def __init__(self, objective: Objective, labels: Iterable[str]):
        hooked = list(objective.reweighters) + [objective.surrogate] + list(objective.regularisers)
        self.components = dict(zip(labels, hooked, strict=True))
        self.states = {label: c.initial_state() for label, c in self.components.items()}
        self.step_start = dict(self.states)
        self.batch_values: dict[str, object] = {}
        self.open_step: dict[str, object] = {}

    def state_dict(self) -> dict:
        """The states of the components that keep one, copied; an open step counted as taken (nothing moves here)."""
        states = dict(self.states)
        for label, totals in self.open_step.items():
            states[label] = self.components[label].begin_step(totals, states[label])[1]
        return {label: copy.deepcopy(state) for label, state in states.items() if state is not None}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` after every component validated its part; nothing changes when it raises."""
        if not isinstance(state, dict):
            raise StateError(
                f"load_state_dict needs a dict of component states, as state_dict() returns, got {type(state).__name__}"
            )
        components = {label: c for label, c in self.components.items() if self.states[label] is not None}
        if set(state) != set(components):
            raise StateError(
                f"state of components {sorted(map(str, state))} does not fit this objective's stateful components "
                f"{sorted(components)}"
            )
        loaded = {label: components[label].validated_state(label, value) for label, value in state.items()}
        for label, value in loaded.items():
            self.states[label] = value
            self.step_start[label] = copy.deepcopy(value)
        self.batch_values = {}  # a training batch begun before the restore is not the restored run's
        self.open_step = {}  # nor a step in parts

    def begin(
        self, labels: Iterable[str], tokens: list[Tokens], comm: Comm, *, update_state: bool = True,
        reuse_batch_values: bool = True, part_of_step: bool = False,
    ) -> tuple[dict[str, object], Pending]:
        """The step value of each component of ``labels``, and the state updates to apply when the step succeeds.

        ``reuse_batch_values``: a component whose value ``begin_training_batch`` froze reuses it
        instead of moving. ``update_state=False``: start from the state the step started from and
        move nothing (a later gather of the same step). ``update_state=True`` first closes an open
        step. ``part_of_step``: ``tokens`` are one part of a step taken in parts; a component whose
        value comes from its state alone takes it from the state the step began with, and adds the
        part's totals to the open step instead of moving.
        """
        if update_state:
            self.close_open_step()
        values, pending = {}, Pending()
        for label in labels:
            if reuse_batch_values and label in self.batch_values:
                values[label] = self.batch_values[label]
                continue
            component = self.components[label]
            sums = component.step_totals(tokens, comm)
            if component.value_from_state() and (part_of_step or label in self.open_step):
                values[label] = component.begin_step(None, self.states[label])[0]
                if part_of_step and sums is not None:
                    pending.parts[label] = sums
                continue
            before = self.states[label] if update_state else self.step_start.get(label, self.states[label])
            values[label], after = component.begin_step(sums, before)
            if update_state:
                pending.moves[label] = (before, after)
        return values, pending

    def commit(self, pending: Pending) -> None:
        """Apply the updates of a step that succeeded."""
        for label, (before, after) in pending.moves.items():
            self.step_start[label] = before
            self.states[label] = after
        for label, totals in pending.parts.items():
            self.open_step[label] = totals + self.open_step[label] if label in self.open_step else totals

    def close_open_step(self) -> None:
        """Move the components of a step taken in parts, once, from the sum of its parts' totals."""
        for label, totals in self.open_step.items():
            before = self.states[label]
            self.step_start[label] = before
            self.states[label] = self.components[label].begin_step(totals, before)[1]
        self.open_step = {}

    def begin_training_batch(self, labels: Iterable[str], tokens: list[Tokens], comm: Comm) -> None:
        """Move the components of ``labels`` by one step from the whole training batch, and freeze their
        values for its steps (only once every component succeeded)."""
        values, pending = self.begin(labels, tokens, comm, reuse_batch_values=False)
        for label, (_, after) in pending.moves.items():
            self.states[label] = self.step_start[label] = after
        self.batch_values = values
