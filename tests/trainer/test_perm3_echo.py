"""``perm3-echo``: ``perm3``, then an echo of the prompt that the reward does not read (spurious tokens by design)."""

import collections

import pytest
import torch

from rlstab.trainer.tasks import CharCodec, Problem, get_task, held_out_problems, scored_text
from rlstab.trainer.warmstart import demonstrations

TASK = get_task("perm3-echo")
PROBLEM = Problem("471=", "147")


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("147,471", 1.0),  # a right ordering and the echo
        ("714,471", 1.0),
        ("147,999", 1.0),  # a wrong echo: never read
        ("147,4", 1.0),  # a short echo
        ("147,47*1:", 1.0),  # anything after the comma
        ("147", 1.0),  # no echo at all
        (" 741 ,471", 1.0),  # whitespace around the answer ignored, as perm3
        ("14,471", 0.0),  # the answer is the text before the first comma: "14"
        ("471,", 1.0),
        (",471", 0.0),  # an empty answer
        ("477,471", 0.0),  # a wrong multiset of digits, whatever the echo
        ("1471,471", 0.0),
        ("", 0.0),
    ],
)
def test_the_reward_reads_the_answer_before_the_first_comma_and_never_the_echo(response, reward):
    assert TASK.reward(PROBLEM, response) == reward


def test_scored_text_is_what_the_reward_reads():
    assert scored_text(TASK, " 147 ,999") == "147"
    assert scored_text(get_task("perm3"), " 147 ") == "147"  # a task without an echo: the whole, stripped
    assert TASK.answers(PROBLEM) == get_task("perm3").answers(PROBLEM)


def test_demonstrations_are_an_ordering_then_the_echo_and_fit_the_budget():
    assert TASK.demonstration(PROBLEM) == "471,471"
    problems = TASK.problems(50, torch.Generator().manual_seed(3))
    assert problems == get_task("perm3").problems(50, torch.Generator().manual_seed(3))  # perm3's problems
    for p in problems:
        text = TASK.demonstration(p)
        assert TASK.reward(p, text) == 1.0
        assert len(CharCodec().encode(text)) + 1 <= TASK.max_new_tokens  # 7 characters and EOS, of 9


def test_the_warm_start_draws_every_ordering_about_equally_and_always_echoes():
    generator = torch.Generator().manual_seed(0)
    drawn = demonstrations(TASK, [PROBLEM] * 6000, generator)
    assert {text.split(",")[1] for text in drawn} == {"471"}
    counts = collections.Counter(text.split(",")[0] for text in drawn)
    assert set(counts) == TASK.answers(PROBLEM)
    # 6000 draws of 6 equally likely orderings: 1000 each, sd sqrt(6000 * 1/6 * 5/6) = 28.9; 150 is over five sd.
    assert all(abs(c - 1000) < 150 for c in counts.values()), counts
    # the same generator stream as perm3's draws: the same orderings
    again = demonstrations(get_task("perm3"), [PROBLEM] * 6000, torch.Generator().manual_seed(0))
    assert [text.split(",")[0] for text in drawn] == again


def test_the_held_out_problems_are_perm3s():
    assert held_out_problems(TASK, 256) == held_out_problems(get_task("perm3"), 256)
