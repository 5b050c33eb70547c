"""A stateful component survives a checkpoint: a resumed run equals an uninterrupted one.

Controllers (STARE's W and M, BAPO's bounds) carry state from step to step; trainers checkpoint
it with ``CompiledObjective.state_dict()`` and restore it with ``load_state_dict``. A state that
is not saved whole, or not restored whole, gives a resumed run that silently differs from the
one that was interrupted. Only reweighters and the surrogate are hooked by the compiled
objective (``StepHook``): state anywhere else is never kept, which the check reports.

For a hooked component with state, the check requires a ``state_model`` (a ``ComponentState``)
that accepts ``initial_state()``, refuses a state with a missing or an unknown field, and runs
``STEPS`` steps of two micro-batches each (each step its own batch and entropy level), once
uninterrupted and once interrupted after each of ``RESUME_AFTER`` steps: saved, passed through
JSON (a state is plain data), loaded into a freshly compiled objective. Every loss, gradient,
metric and the final state must be identical, and the state must have moved (a state that never
changes proves nothing).

Trainer-executed components (``sampler``, ``rollout``) keep their state in the runtime they
return (``curriculum(seed)``, ``explorer(seed)``): the check drives it through its documented
interface for ``STEPS`` steps, saves its ``state_dict()`` through ``torch.save`` /
``torch.load(weights_only=True)`` (a checkpoint), loads it into a fresh runtime of the same
seed and compares every decision, metric and the final state.
"""

from __future__ import annotations

import copy
import io
import json

from rlstab.components import ComponentState
from rlstab.errors import StateError
from rlstab.lazy import torch
from rlstab.registry import FAMILIES
from rlstab.testing.batches import leaves, make_batch, take
from rlstab.testing.compare import assert_same, differences, plain
from rlstab.testing.hosting import component_label, family_name, host_objective
from rlstab.testing.report import checking
from rlstab.testing.running import gradients

HOOKED = ("reweighters", "surrogate", "regularisers")
STEPS = 5
RESUME_AFTER = (1, 3)
ENTROPY_SCALES = (0.6, 1.4, 0.5, 1.3, 0.8, 1.2)  # the step's mean entropy below and above 1, in turn
SPLIT = ((0, 7), (7, 16))


def runtime_factory(component):
    """``curriculum`` (sampler) or ``explorer`` (rollout): the method that builds the component's runtime, or None."""
    for name in ("curriculum", "explorer"):
        method = getattr(component, name, None)
        if callable(method):
            return method
    return None


def is_stateful(component) -> bool:
    """Whether ``check_state_round_trip`` applies: a loss component with (declared) state, or a trainer
    component whose runtime has ``state_dict``."""
    if FAMILIES[family_name(component)].scope == "trainer":
        factory = runtime_factory(component)
        return factory is not None and hasattr(factory(0), "state_dict")
    initial = getattr(component, "initial_state", None)
    return getattr(component, "state_model", None) is not None or (callable(initial) and initial() is not None)


def check_state_round_trip(component, *, host=None) -> None:
    """Resume after a checkpoint == uninterrupted; the state model accepts real states and refuses broken ones."""
    with checking(component, "check_state_round_trip"):
        family = family_name(component)
        if FAMILIES[family].scope == "trainer":
            _check_runtime(component)
        else:
            _check_hooked(component, host, family)


# ---------------------------------------------------------------- loss components


def _check_hooked(component, host, family: str) -> None:
    initial = component.initial_state() if callable(getattr(component, "initial_state", None)) else None
    if initial is None and getattr(component, "state_model", None) is None:
        raise AssertionError("keeps no state (no state_model, initial_state() is None): the check does not apply")
    if family not in HOOKED:
        raise AssertionError(
            f"has state (initial_state() = {initial!r}), but the compiled objective keeps state only for "
            f"{' and '.join(HOOKED)} (StepHook): a {family} component's state is never saved or advanced"
        )
    model = component.state_model
    assert model is not None, "initial_state() is not None, but state_model is None: load_state_dict would refuse every state"
    assert isinstance(model, type) and issubclass(model, ComponentState), (
        f"state_model must derive from rlstab.components.ComponentState, got {model!r}"
    )
    assert initial is not None, "declares a state_model, but initial_state() is None: no state is ever kept"
    objective = host_objective(component, host)
    label = component_label(objective, component)
    plain_initial = json.loads(json.dumps(initial))
    assert component.validated_state(label, plain_initial) == initial, "the state model changes initial_state()"

    fresh = objective.compile()
    saved = fresh.state_dict()
    assert saved.get(label) == initial, f"state_dict()[{label!r}] is {saved.get(label)!r}, not initial_state()"
    for broken, why in _broken_states(initial):
        try:
            objective.compile().load_state_dict({**saved, label: broken})
        except StateError:
            continue
        raise AssertionError(f"load_state_dict accepts a state with {why}: {broken!r}")

    uninterrupted_fn = objective.compile()
    uninterrupted = _run(uninterrupted_fn, range(STEPS))
    final = uninterrupted_fn.state_dict()
    assert final[label] != initial, f"the state never changed over {STEPS} steps ({initial!r}): the check would prove nothing"
    for k in RESUME_AFTER:
        first = objective.compile()
        head = _run(first, range(k))
        try:
            checkpoint = json.loads(json.dumps(first.state_dict()))
        except (TypeError, ValueError) as err:
            raise AssertionError(f"state_dict() is not plain data (JSON): {err}") from err
        resumed = objective.compile()
        resumed.load_state_dict(checkpoint)
        tail = _run(resumed, range(k, STEPS))
        for step, (got, want) in enumerate(zip(head + tail, uninterrupted)):
            assert_same(got, want, f"resumed after step {k}: step {step}'s losses, gradients and metrics", rtol=0.0, atol=0.0)
        assert_same(resumed.state_dict(), final, f"resumed after step {k}: the final state", rtol=0.0, atol=0.0)


def _broken_states(initial: dict) -> list[tuple[dict, str]]:
    broken = [({**initial, "kit_unknown_field": 1.0}, "an unknown field")]
    if initial:
        missing = dict(initial)
        missing.pop(next(iter(missing)))
        broken.append((missing, f"a missing field ({next(iter(initial))!r})"))
    return broken


def _run(loss_fn, steps) -> list:
    """Per step: each micro-batch's loss, gradient and metrics."""
    out = []
    for step in steps:
        batch = make_batch(loss_fn, seed=100 + step, entropy_scale=ENTROPY_SCALES[step % len(ENTROPY_SCALES)])
        leaf = leaves(batch)
        micro = [take(batch, lo, hi, leaf) for lo, hi in SPLIT]
        stats = loss_fn.gather(micro)
        results = []
        for mb in micro:
            res = loss_fn(mb, step=stats)
            res.loss.backward()
            results.append({"loss": res.loss.detach(), "metrics": res.metrics})
        out.append({"micro_batches": results, "grad": gradients(leaf)})
    return out


# ---------------------------------------------------------------- trainer components


def _check_runtime(component) -> None:
    factory = runtime_factory(component)
    assert factory is not None, "has no curriculum(seed) or explorer(seed)"
    drive = _DRIVERS.get(family_name(component))
    assert drive is not None, f"the kit has no driver for the {family_name(component)} family's runtime"
    seed = 3
    uninterrupted = factory(seed)
    initial = _checkpoint(uninterrupted.state_dict())
    decisions = [drive(component, uninterrupted, step) for step in range(STEPS)]
    final = plain(uninterrupted.state_dict())
    assert differences(final, plain(initial), rtol=0.0, atol=0.0), (
        f"the runtime's state never changed over {STEPS} steps: the check would prove nothing"
    )
    for k in RESUME_AFTER:
        first = factory(seed)
        head = [drive(component, first, step) for step in range(k)]
        resumed = factory(seed)
        resumed.load_state_dict(_checkpoint(first.state_dict()))
        tail = [drive(component, resumed, step) for step in range(k, STEPS)]
        assert_same(head + tail, decisions, f"resumed after step {k}: the runtime's decisions and metrics", rtol=0.0, atol=0.0)
        assert_same(resumed.state_dict(), final, f"resumed after step {k}: the runtime's final state", rtol=0.0, atol=0.0)


def _checkpoint(state):
    """``state`` through ``torch.save`` and ``torch.load(weights_only=True)``, as a trainer checkpoint takes it."""
    buffer = io.BytesIO()
    torch.save(copy.deepcopy(state), buffer)
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True)
    except Exception as err:
        raise AssertionError(f"state_dict() does not load with torch.load(weights_only=True): {err}") from err


def _drive_sampler(component, curriculum, step: int) -> dict:
    """One step of a sampler runtime (``pool_size``, ``choose``, ``observe``): which prompts, and its metrics."""
    n = 4
    size = curriculum.pool_size(n)
    prompts = [f"prompt {(step * size + i) % 97}: solve {i % 7} + {step} = ?" for i in range(size)]
    chosen = [int(i) for i in curriculum.choose(prompts, n)]
    rates = [((int(i) * 5 + step) % 5) / 4 for i in chosen]
    metrics = curriculum.observe([prompts[i] for i in chosen], rates)
    return {"chosen": chosen, "metrics": metrics}


def _drive_rollout(component, explorer, step: int) -> dict:
    """One step of a rollout runtime (``choose`` pivots of failed responses, ``observe`` their branches)."""
    sentence = ["The", " sum", " is", " even", ".", " So", " we", " halve", " it", "."]
    responses = [sentence * (1 + (step + i) % 3) for i in range(6)]
    rewards = [float((step + i) % 3 == 0) for i in range(6)]
    pivots = explorer.choose(responses, rewards)
    branches = int(getattr(component, "branches", 4))
    g = torch.Generator().manual_seed(1000 + step)
    outcome = (torch.rand(len(pivots), branches, generator=g) < 0.4).float()
    metrics = explorer.observe(pivots, outcome)
    return {"pivots": [repr(p) for p in pivots], "metrics": metrics}


_DRIVERS = {"sampler": _drive_sampler, "rollout": _drive_rollout}
