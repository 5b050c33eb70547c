"""``load_state_dict`` validates every component's state before anything changes.

Each stateful component declares its state model (``StepHook.state_model``); a state it cannot
have produced is refused with a ``StateError`` naming the component, the field and the value,
instead of a ``KeyError`` steps later or a NaN loss.
"""

from __future__ import annotations

import json

import pytest
import torch

import rlstab
from rlstab import StateError

from batches import random_batch

STARE = {"extends": "dapo", "reweighters": [{"kind": "stare", "variant": "C2", "adaptive": True, "w_max": 1.5, "m_min": 0.5}]}
STARE_LABEL = "reweighters[0] (stare)"
BAPO_LABEL = "surrogate (bapo)"
GOOD_STARE = {"gate": True, "W": 1.2, "M": 0.8, "H_bar": 0.25}
GOOD_BAPO = {"clip_low": 0.62, "clip_high": 1.75, "steps": 3}


def stare():
    return rlstab.load(STARE).compile()


def bapo():
    return rlstab.load("bapo").compile()


def refused(loss_fn, state: object) -> str:
    before = loss_fn.state_dict()
    with pytest.raises(StateError) as info:
        loss_fn.load_state_dict(state)
    assert loss_fn.state_dict() == before  # nothing changed
    return str(info.value)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"gate": True, "M": 0.9, "H_bar": None}, f"state['{STARE_LABEL}'].W: required field is missing"),
        ({**GOOD_STARE, "W": float("nan")}, f"state['{STARE_LABEL}'].W = nan: Input should be a finite number"),
        ({**GOOD_STARE, "W": float("inf")}, f"state['{STARE_LABEL}'].W = inf: Input should be a finite number"),
        ({**GOOD_STARE, "W": 1.6}, f"state['{STARE_LABEL}'].W = 1.6: W must lie within [1, w_max = 1.5], where the controller keeps it"),
        ({**GOOD_STARE, "W": 0.9}, f"state['{STARE_LABEL}'].W = 0.9: W must lie within [1, w_max = 1.5], where the controller keeps it"),
        ({**GOOD_STARE, "M": 0.4}, f"state['{STARE_LABEL}'].M = 0.4: M must lie within [m_min = 0.5, 1], where the controller keeps it"),
        ({**GOOD_STARE, "M": 1.01}, f"state['{STARE_LABEL}'].M = 1.01: M must lie within [m_min = 0.5, 1], where the controller keeps it"),
        ({**GOOD_STARE, "H_bar": float("nan")}, f"state['{STARE_LABEL}'].H_bar = nan: Input should be a finite number"),
        ({**GOOD_STARE, "gate": 1}, f"state['{STARE_LABEL}'].gate = 1: Input should be a valid boolean"),
        ({**GOOD_STARE, "W": "1.2"}, f"state['{STARE_LABEL}'].W = '1.2': Input should be a valid number"),
        ({**GOOD_STARE, "steps": 3}, f"state['{STARE_LABEL}'].steps = 3: unknown field (the state has gate, W, M, H_bar)"),
    ],
)
def test_stare_states_that_the_controller_cannot_reach_are_refused(state, message):
    assert refused(stare(), {STARE_LABEL: state}) == message


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({**GOOD_BAPO, "steps": -5}, f"state['{BAPO_LABEL}'].steps = -5: Input should be greater than or equal to 0"),
        ({**GOOD_BAPO, "steps": 1.5}, f"state['{BAPO_LABEL}'].steps = 1.5: Input should be a valid integer"),
        ({**GOOD_BAPO, "steps": True}, f"state['{BAPO_LABEL}'].steps = True: Input should be a valid integer"),
        ({**GOOD_BAPO, "clip_low": float("nan")}, f"state['{BAPO_LABEL}'].clip_low = nan: Input should be a finite number"),
        # the paper's search visits 0.6, 0.62, ..., 0.8999999999999999 (0.6 + 15 * 0.02) and 1.2, 1.25, ..., 3.0
        (
            {**GOOD_BAPO, "clip_low": 0.5},
            f"state['{BAPO_LABEL}'].clip_low = 0.5: must lie within [0.6, 0.8999999999999999], "
            "the bounds the search visits (lower_start to lower_max)",
        ),
        (
            {**GOOD_BAPO, "clip_high": 3.5},
            f"state['{BAPO_LABEL}'].clip_high = 3.5: must lie within [1.2, 3.0], "
            "the bounds the search visits (upper_start to upper_max)",
        ),
    ],
)
def test_bapo_states_that_the_search_cannot_reach_are_refused(state, message):
    assert refused(bapo(), {BAPO_LABEL: state}) == message


def test_several_problems_are_reported_together():
    message = refused(bapo(), {BAPO_LABEL: {"clip_low": 0.6, "clip_high": float("inf"), "steps": -1}})
    assert "clip_high = inf" in message and "steps = -1" in message


def test_authors_code_bounds_one_rounding_above_the_maximum_are_accepted():
    """0.8 + 3 * 0.05 = 0.9500000000000001 > lower_max 0.95: the search's last lower bound, so a state may hold it."""
    surrogate = {"kind": "bapo", "search": "authors_code", "lower_start": 0.8, "lower_max": 0.95, "lower_step": 0.05,
                 "upper_start": 1.2, "upper_max": 2.0, "upper_step": 0.1}
    loss_fn = rlstab.load({"extends": "grpo", "surrogate": surrogate}).compile()
    assert loss_fn.objective.surrogate.candidates()[1][-1] == 0.9500000000000001
    loss_fn.load_state_dict({BAPO_LABEL: {"clip_low": 0.9500000000000001, "clip_high": 2.0, "steps": 1}})
    assert loss_fn.state_dict()[BAPO_LABEL]["clip_low"] == 0.9500000000000001


@pytest.mark.parametrize("state", ["not a state", None, [("surrogate (bapo)", GOOD_BAPO)], 3])
def test_a_state_that_is_not_a_dict_is_refused(state):
    assert "load_state_dict needs a dict of component states" in refused(bapo(), state)


def test_a_component_state_that_is_not_a_dict_is_refused():
    message = refused(bapo(), {BAPO_LABEL: "0.6,1.2,3"})
    assert message.startswith(f"state['{BAPO_LABEL}'] = '0.6,1.2,3': a component's state is a dict")


def test_another_objectives_state_is_a_state_error_too():
    message = refused(bapo(), {STARE_LABEL: GOOD_STARE})
    assert "does not fit this objective's stateful components" in message


def test_one_bad_component_leaves_every_component_as_it_was():
    both = {"extends": "bapo", "reweighters": STARE["reweighters"]}
    loss_fn = rlstab.load(both).compile()
    refused(loss_fn, {STARE_LABEL: GOOD_STARE, BAPO_LABEL: {**GOOD_BAPO, "steps": -1}})


def test_integers_for_float_fields_come_back_as_floats():
    """A JSON writer may turn 1.0 into 1: accepted, and stored as the float the run would have held."""
    loss_fn = stare()
    loss_fn.load_state_dict({STARE_LABEL: {"gate": False, "W": 1, "M": 1, "H_bar": 2}})
    state = loss_fn.state_dict()[STARE_LABEL]
    assert state == {"gate": False, "W": 1.0, "M": 1.0, "H_bar": 2.0}
    assert all(isinstance(state[k], float) for k in ("W", "M", "H_bar"))


def test_every_stateful_component_declares_its_state_model():
    """Every component that keeps a state validates it: its initial state, and the state after a step, pass."""
    for name in [*rlstab.preset_names(), STARE]:
        loss_fn = rlstab.load(name).compile()
        loss_fn.gather([random_batch(B=8, T=6, seed=1)])
        for label, state in loss_fn.state_dict().items():
            component = loss_fn._states.components[label]
            assert component.state_model is not None, label
            assert component.validated_state(label, json.loads(json.dumps(state))) == state


def test_a_loaded_bapo_state_resumes_exactly():
    """BAPO's saved state (bounds, step count) through JSON: the resumed objective's next step is the same."""
    steps = [random_batch(B=8, T=10, seed=20 + k, advantages="sequence") for k in range(3)]
    first = bapo()
    for batch in steps[:2]:
        first(batch)
    saved = json.loads(json.dumps(first.state_dict()))
    assert saved[BAPO_LABEL]["steps"] == 2
    resumed = bapo()
    resumed.load_state_dict(saved)
    a, b = first(steps[2]), resumed(steps[2])
    assert a.metrics == b.metrics and torch.equal(a.loss, b.loss)
    assert first.state_dict() == resumed.state_dict()
    assert resumed.state_dict()[BAPO_LABEL]["steps"] == 3
