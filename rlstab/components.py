"""The base every component derives from: a frozen pydantic model with a ``kind`` tag.

``extra="forbid"`` turns a misspelt YAML field into an error instead of a silently ignored key;
``strict`` refuses ``true`` for a number and ``"0.2"`` for a float instead of coercing them;
``frozen`` makes a compiled objective immune to later edits of its config. A NaN is refused in
every field (no comparison with it means anything); ``.inf`` passes only where a field's bounds
admit it, as a cap that never binds.

A field takes Python numbers (``int``, ``float``, and their subclasses such as ``numpy.float64``),
as YAML gives them. A tensor, a numpy array or numpy scalar of another type, or any other object
that merely converts to a number is refused (``python_numbers``), in every component (plugins'
included) and in their states, even where its conversion would be exact: a float32
``torch.tensor(0.3)`` converts to 0.30000001192092896, not the 0.3 that was written, and one rule
for every dtype is easier to trust than a rule that depends on the dtype (a float64 tensor would
convert exactly, a float32 or bfloat16 one would not). A CUDA tensor would also need a host
synchronisation to read.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_serializer

from rlstab.errors import StateError, short
from rlstab.lazy import torch


class Component(BaseModel):
    """A declarative piece of an objective.

    Subclasses set ``kind`` (the YAML tag), ``reads`` (the [`TokenBatch`][rlstab.TokenBatch] fields they
    need beyond logprobs and response_mask) and implement their family's methods.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    reads: ClassVar[frozenset[str]] = frozenset()
    # Fields added after fingerprints were first published: left out of the dump while at their default,
    # so that an objective without them keeps its fingerprint (and a lab folder resumes).
    _later_fields: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_default_later_fields(self, handler):
        data = handler(self)
        if isinstance(data, dict):
            for name in self._later_fields:
                if getattr(self, name) == type(self).model_fields[name].default:
                    data.pop(name, None)
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _python_numbers(cls, value: Any) -> Any:
        return python_numbers(value)

    @field_validator("*", mode="after")
    @classmethod
    def _not_nan(cls, value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("NaN is not a value (write a number)")
        return value

    def describe(self) -> str:
        """One line: what this component computes, with every parameter."""
        raise NotImplementedError


class ComponentState(BaseModel):
    """Base of a stateful component's state model: the fields a saved state must have, nothing else.

    ``strict`` refuses ``"1.1"`` for a float and ``1`` for a bool (an int is accepted for a float,
    as a JSON round trip may write ``1.0`` as ``1``, and stored as a float); NaN and infinities
    are refused. Validators that depend on the component's configuration (a bound such as STARE's
    ``w_max``) find the component in ``info.context["component"]``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _python_numbers(cls, value: Any) -> Any:
        return python_numbers(value)


def python_numbers(value: Any) -> Any:
    """``value`` itself when it holds no object that merely converts to a number (a tensor, a numpy array,
    a numpy scalar that is not a Python ``int`` or ``float``, a ``Decimal``), within lists and tuples too;
    ``ValueError`` naming its type otherwise. A field validator (``mode="before"``) of every component."""
    if isinstance(value, (bool, int, float, str, bytes, BaseModel)) or value is None:
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            python_numbers(item)
        return value
    if any(hasattr(value, name) for name in ("__float__", "__index__", "__array__")):
        kind = type(value)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"
        raise ValueError(
            f"a {name} is not accepted: pass a Python number, e.g. x.item() or float(x) (a float32 tensor holds 0.3 "
            "as 0.30000001192092896)"
        )
    return value


def configured(info) -> Any:
    """The component a state is validated for (``info.context["component"]``), or None outside ``load_state_dict``."""
    return (info.context or {}).get("component")


class StepHook:
    """Optional step-level behaviour of a reweighter or surrogate (STARE's gate, BAPO's bounds).

    Once per step the compiled objective sums ``step_sums`` over every micro-batch and rank, then
    calls ``begin_step`` with the totals and the component's state (which it keeps, and saves in
    ``state_dict()``); the returned step value is handed to the component on every micro-batch.
    Components without step-level behaviour inherit these no-ops.

    A component with a state declares its ``state_model`` (a [`ComponentState`][rlstab.components.ComponentState]),
    so that ``load_state_dict`` refuses, with a message naming the field and the value, a state
    that a run of this component cannot have produced, before it can fail (or silently
    misbehave) steps later: a missing key would be a ``KeyError`` in the middle of a step, a NaN
    bound a NaN loss.
    """

    state_model: ClassVar[type[ComponentState] | None] = None

    def step_sums(self, t) -> torch.Tensor | None:
        """A 1-D float64 tensor of sums over this micro-batch's tokens, or None (no step statistics)."""
        return None

    def step_totals(self, tokens: list, comm: Any) -> torch.Tensor | None:
        """The step statistic handed to ``begin_step``: ``step_sums`` summed over the micro-batches
        ``tokens`` and the ranks of ``comm`` (None without them). A component whose statistic is not
        a sum (M2PO's cut, an order statistic over the step) overrides this, collectively over ``comm``."""
        parts = [self.step_sums(t) for t in tokens]
        return comm.sum(torch.stack(parts).sum(0)) if tokens and parts[0] is not None else None

    def initial_state(self) -> dict[str, Any] | None:
        """The state before the first step (plain floats/ints, so it survives a checkpoint), or None."""
        return None

    def state_cadence(self) -> str:
        """When ``begin_step`` runs: ``"optimizer_step"`` (every gather), or ``"training_batch"``.

        ``training_batch``: once per training batch (the rollout batch a trainer splits into
        optimizer steps), from that whole batch, when the trainer's adapter calls
        [`CompiledObjective.begin_training_batch`][rlstab.CompiledObjective.begin_training_batch];
        each optimizer step of the batch then reuses the batch's step value. Without that call
        every gather is its own training batch.
        """
        return "optimizer_step"

    def value_from_state(self) -> bool:
        """Whether the step value comes from the state alone, never from the step's own totals (a controller
        that acts on its last measurement: adaptive entropy), with ``step_totals`` a sum over micro-batches.

        Such a component stays exact where a trainer computes the loss one micro-batch at a time and
        never sees the whole step first: every micro-batch takes the value of the state the step
        began with, the micro-batches' totals add up to the step's, and the state moves once, after
        the step (``gather(..., part_of_step=True)``). A stateful component whose value reads the
        step's totals (BAPO's bounds, STARE's gate) is exact only when the whole step is gathered
        before its first micro-batch. When True, ``begin_step(None, state)`` must give the value that
        ``begin_step(sums, state)`` gives for any ``sums``.
        """
        return False

    def begin_step(self, sums: torch.Tensor | None, state: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
        """``(step_value, new_state)`` from the step's totals; called once per step.

        ``sums`` is None for a step without micro-batches (``gather([])``): the state must then
        move as for a step without valid tokens.
        """
        return None, state

    def validated_state(self, label: str, state: Any) -> dict[str, Any]:
        """``state`` (as loaded from a checkpoint) checked against ``state_model``, as plain values.

        Raises [`StateError`][rlstab.StateError] naming ``label``, the field and the value:
        ``state['surrogate (bapo)'].steps = -5: Input should be greater than or equal to 0``.
        """
        if self.state_model is None:
            raise StateError(f"state[{label!r}]: this component keeps no state")
        if not isinstance(state, dict):
            raise StateError(
                f"state[{label!r}] = {short(state)}: a component's state is a dict (as state_dict() saves it), "
                f"got {type(state).__name__}"
            )
        try:
            model = self.state_model.model_validate(state, context={"component": self})
        except ValidationError as err:
            raise StateError("; ".join(_state_problems(label, self.state_model, err))) from None
        return model.model_dump()

    def step_metrics(self, step_value: Any) -> dict[str, float]:
        """Metrics of the step value (e.g. whether a gate is open), without the component prefix."""
        return {}


def _state_problems(label: str, model: type[ComponentState], err: ValidationError) -> list[str]:
    """One message per field (a union reports each of its alternatives: the first one is kept)."""
    problems, seen = [], set()
    for e in err.errors(include_url=False):
        field = str(e["loc"][0]) if e["loc"] else "<state>"
        if field in seen:
            continue
        seen.add(field)
        where = f"state[{label!r}].{field}"
        if e["type"] == "missing":
            problems.append(f"{where}: required field is missing")
        elif e["type"] == "extra_forbidden":
            problems.append(f"{where} = {short(e['input'])}: unknown field (the state has {', '.join(model.model_fields)})")
        else:
            message = e["msg"].removeprefix("Value error, ")
            problems.append(f"{where} = {short(e['input'])}: {message}")
    return problems
