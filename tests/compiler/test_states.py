"""``rlstab.compiler.states``: the stateful components' states and the one loop that takes their step.

A counter component: its state is ``{"n": steps so far}``, its step total the number of micro-batches
(one per micro-batch), and ``begin_step`` gives ``(n + total, {"n": n + 1})``: its value reads the step.
A tally component, whose value comes from its state alone: state ``{"n": micro-batches counted so
far}``, ``begin_step`` gives ``(n, {"n": n + total})``.
"""

import copy
from types import SimpleNamespace

import pytest

from rlstab.compiler.states import ComponentStates, Pending
from rlstab.errors import StateError


class Counter:
    def initial_state(self):
        return {"n": 0}

    def step_totals(self, tokens, comm):
        return len(tokens)

    def begin_step(self, sums, state):
        return state["n"] + sums, {"n": state["n"] + 1}

    def value_from_state(self):
        return False

    def validated_state(self, label, state):
        if not isinstance(state.get("n"), int):
            raise StateError(f"state[{label!r}].n = {state.get('n')!r}")
        return dict(state)


class Tally(Counter):
    def begin_step(self, sums, state):
        return state["n"], {"n": state["n"] + (sums or 0)}

    def value_from_state(self):
        return True


class Stateless:
    def initial_state(self):
        return None


LABELS = ["reweighters[0] (counter)", "surrogate (plain)"]
R, S = LABELS


def states():
    objective = SimpleNamespace(reweighters=[Counter()], surrogate=Stateless(), regularisers=[])
    return ComponentStates(objective, LABELS)


def test_components_take_their_labels_in_hook_order_and_need_one_each():
    s = states()
    assert list(s.components) == LABELS and s.states == {R: {"n": 0}, S: None}
    with pytest.raises(ValueError):  # two labels for three components
        ComponentStates(SimpleNamespace(reweighters=[Counter()], surrogate=Stateless(), regularisers=[Counter()]), LABELS)


def test_a_step_moves_nothing_until_it_is_committed():
    s = states()
    values, pending = s.begin([R], ["mb1", "mb2"], None)
    # n = 0, two micro-batches: value 0 + 2 = 2, next state n = 1
    assert values == {R: 2} and pending.moves == {R: ({"n": 0}, {"n": 1})} and pending.parts == {}
    assert s.states[R] == {"n": 0}
    s.commit(pending)
    assert s.states[R] == {"n": 1} and s.step_start[R] == {"n": 0}


def test_a_later_gather_of_the_same_step_starts_where_the_step_started():
    s = states()
    s.commit(s.begin([R], ["mb"], None)[1])  # step 1: n 0 -> 1
    values, pending = s.begin([R], ["mb", "mb", "mb"], None, update_state=False)
    # from step_start n = 0, not n = 1: value 0 + 3 = 3; nothing to commit
    assert values == {R: 3} and pending == Pending()


def test_a_training_batch_freezes_its_values_for_its_steps():
    s = states()
    s.begin_training_batch([R], ["mb"], None)  # n 0 -> 1 at once, value 0 + 1 = 1 frozen
    assert s.states[R] == s.step_start[R] == {"n": 1} and s.batch_values == {R: 1}
    values, pending = s.begin([R], ["mb", "mb"], None)
    assert values == {R: 1} and pending == Pending()  # the frozen value, not 1 + 2
    values, _ = s.begin([R], ["mb", "mb"], None, reuse_batch_values=False)
    assert values == {R: 3}  # n = 1, two micro-batches


def test_state_dict_copies_the_states_that_exist():
    s = states()
    saved = s.state_dict()
    assert saved == {R: {"n": 0}}
    saved[R]["n"] = 99
    assert s.states[R] == {"n": 0}


def test_load_state_dict_restores_and_forgets_the_training_batch():
    s = states()
    s.begin_training_batch([R], ["mb"], None)
    s.load_state_dict({R: {"n": 7}})
    assert s.states[R] == s.step_start[R] == {"n": 7} and s.batch_values == {}


@pytest.mark.parametrize("bad, message", [
    ([("n", 1)], "load_state_dict needs a dict of component states, as state_dict() returns, got list"),
    ({"surrogate (bapo)": {"n": 1}}, "does not fit this objective's stateful components"),
    ({R: {"n": "seven"}}, "state['reweighters[0] (counter)'].n = 'seven'"),
])
def test_a_state_that_does_not_fit_changes_nothing(bad, message):
    s = states()
    before = copy.deepcopy((s.states, s.step_start))
    with pytest.raises(StateError) as info:
        s.load_state_dict(bad)
    assert message in str(info.value)
    assert (s.states, s.step_start) == before


# ---------------------------------------------------------------- a step taken in parts


def tally_states():
    return ComponentStates(SimpleNamespace(reweighters=[Tally()], surrogate=Stateless(), regularisers=[]), LABELS)


def take_part(s, parts, first):
    values, pending = s.begin([R], parts, None, update_state=first, part_of_step=True)
    s.commit(pending)
    return values[R]


def test_a_step_in_parts_moves_once_from_the_sum_of_its_parts():
    s = tally_states()
    # step 1 in two parts of 1 and 2 micro-batches: both take n = 0, nothing moves yet
    assert take_part(s, ["a"], first=True) == 0 and take_part(s, ["b", "c"], first=False) == 0
    assert s.states[R] == {"n": 0} and s.open_step == {R: 3}  # 1 + 2
    assert s.state_dict() == {R: {"n": 3}} and s.states[R] == {"n": 0}  # counted as taken, nothing moved
    # step 2's first part closes step 1 (n 0 -> 3) and takes n = 3
    assert take_part(s, ["d"], first=True) == 3
    assert s.states[R] == {"n": 3} and s.step_start[R] == {"n": 0} and s.open_step == {R: 1}


def test_the_same_step_whole_moves_the_same():
    whole, parts = tally_states(), tally_states()
    values, pending = whole.begin([R], ["a", "b", "c"], None)
    whole.commit(pending)
    take_part(parts, ["a"], first=True)
    take_part(parts, ["b", "c"], first=False)
    assert values[R] == 0 and whole.state_dict() == parts.state_dict() == {R: {"n": 3}}


def test_a_part_that_is_not_committed_adds_nothing():
    s = tally_states()
    take_part(s, ["a"], first=True)
    s.begin([R], ["b", "c"], None, update_state=False, part_of_step=True)  # raised later: never committed
    assert s.open_step == {R: 1} and s.state_dict() == {R: {"n": 1}}


def test_a_gather_outside_the_parts_reads_the_state_the_open_step_began_with():
    s = tally_states()
    s.commit(s.begin([R], ["a"], None)[1])  # a whole step: n 0 -> 1
    take_part(s, ["b", "c"], first=True)  # an open step from n = 1
    values, pending = s.begin([R], ["x"], None, update_state=False)  # e.g. an evaluation between steps
    assert values == {R: 1} and pending == Pending() and s.open_step == {R: 2}


def test_load_state_dict_forgets_an_open_step():
    s = tally_states()
    take_part(s, ["a", "b"], first=True)
    s.load_state_dict({R: {"n": 7}})
    assert s.open_step == {} and s.state_dict() == {R: {"n": 7}}
    assert take_part(s, ["c"], first=True) == 7  # nothing left to close
