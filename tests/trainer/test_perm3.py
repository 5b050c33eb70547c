"""``perm3``: any ordering of a 3-digit number's digits, a task with several right answers."""

import collections

import pytest
import torch

from rlstab.trainer.tasks import (
    CharCodec,
    Problem,
    get_task,
    held_out_problems,
    is_held_out,
    training_problems,
)
from rlstab.trainer.warmstart import demonstrations

TASK = get_task("perm3")


@pytest.mark.parametrize(
    ("prompt", "right"),
    [
        ("471=", {"147", "174", "417", "471", "714", "741"}),  # three distinct digits: 3! = 6 orderings
        ("447=", {"447", "474", "744"}),  # a repeated digit: 3! / 2! = 3
        ("444=", {"444"}),  # one digit thrice: 3! / 3! = 1
        ("100=", {"100", "010", "001"}),  # 3! / 2! = 3, leading zeros allowed (a string's ordering)
    ],
)
def test_the_right_answers_are_the_distinct_orderings(prompt, right):
    problem = Problem(prompt, "".join(sorted(prompt.rstrip("="))))
    assert TASK.answers(problem) == right
    for answer in right:
        assert TASK.reward(problem, answer) == 1.0
        assert TASK.reward(problem, f" {answer} ") == 1.0  # surrounding whitespace ignored
    for wrong in ("", "47", "4711", "472", prompt, prompt.rstrip("=") + ":"):
        assert TASK.reward(problem, wrong) == 0.0, wrong


def test_problems_are_seeded_and_their_demonstrations_right():
    a = TASK.problems(50, torch.Generator().manual_seed(3))
    assert a == TASK.problems(50, torch.Generator().manual_seed(3))
    for p in a:
        assert 100 <= int(p.prompt.rstrip("=")) <= 999
        assert p.answer == "".join(sorted(p.prompt.rstrip("=")))
        assert TASK.reward(p, TASK.demonstration(p)) == 1.0
        assert len(CharCodec().encode(TASK.demonstration(p))) + 1 <= TASK.max_new_tokens


def test_the_warm_start_draws_every_ordering_about_equally():
    problem = Problem("471=", "147")
    generator = torch.Generator().manual_seed(0)
    counts = collections.Counter(demonstrations(TASK, [problem] * 6000, generator))
    assert set(counts) == TASK.answers(problem)
    # 6000 draws of 6 equally likely orderings: 1000 each, standard deviation sqrt(6000 * 1/6 * 5/6) = 28.9;
    # 150 is more than five of them.
    assert all(abs(c - 1000) < 150 for c in counts.values()), counts


def test_other_tasks_demonstrate_without_drawing():
    add2 = get_task("add2")
    problems = add2.problems(5, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    state = generator.get_state()
    assert demonstrations(add2, problems, generator) == [add2.demonstration(p) for p in problems]
    assert torch.equal(generator.get_state(), state)


def test_the_held_out_tenth_is_apart_from_training():
    held = held_out_problems(TASK, 256)
    # zlib.crc32 puts 98 of the 900 prompts "100=" ... "999=" in the held-out tenth.
    assert len(held) == 98 and all(is_held_out(p) for p in held)
    train = training_problems(TASK, 300, torch.Generator().manual_seed(0))
    assert not {p.prompt for p in train} & {p.prompt for p in held}
