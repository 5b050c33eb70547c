"""The demo's tasks: exact-match rewards on hand examples, demonstrations, the codec, the held-out split."""

import pytest
import torch

from rlstab.trainer.tasks import (
    CharCodec,
    Problem,
    final_answer,
    get_task,
    held_out_problems,
    is_held_out,
    task_names,
    training_problems,
)

ADD2 = Problem("47+38=", "85")


@pytest.mark.parametrize(
    "response, reward",
    [
        ("7+8=15,4+3+1=8:85", 1.0),
        ("7+8=15,4+3+0=7:85", 1.0),  # a wrong step, right answer: the reward reads the answer only
        ("7+8=15,4+3+1=8:75", 0.0),
        (":85", 1.0),
        ("85", 0.0),  # no ':' before the answer
        ("7+8=15,4+3+1=8:850", 0.0),
        ("7+8=15,4+3+1=8:8", 0.0),
        ("7+8=15:1,4+3+1=8:85", 1.0),  # the last ':' counts
        ("7+8=15,4+3+1=8:85,", 0.0),
        ("", 0.0),
    ],
)
def test_add2_reward_hand_examples(response, reward):
    assert get_task("add2").reward(ADD2, response) == reward


@pytest.mark.parametrize(
    "response, reward",
    [
        ("15", 1.0),
        (" 15", 1.0),  # a tokenizer's leading space is not part of the answer
        ("15\n", 1.0),
        (":15", 0.0),  # add1 is answered directly: the whole response is the answer
        ("7+8=15", 0.0),
        ("16", 0.0),
        ("150", 0.0),
        ("1 5", 0.0),
        ("", 0.0),
    ],
)
def test_add1_reward_hand_examples(response, reward):
    assert get_task("add1").reward(Problem("7+8=", "15"), response) == reward


def test_add1_space_and_held_out_tenth():
    task = get_task("add1")
    problems = task.problems(2000, torch.Generator().manual_seed(0))
    operands = {int(x) for p in problems for x in p.prompt.rstrip("=").split("+")}
    assert operands == set(range(1, 10))  # 9 x 9 = 81 problems
    # The crc32 split keeps 13 of the 81 aside; held_out_problems returns all of them, and no more.
    held = held_out_problems(task, 256)
    assert len(held) == 13 and all(is_held_out(p) for p in held)
    assert len({p.prompt for p in problems if is_held_out(p)}) == 13


def test_final_answer():
    assert final_answer("a:b:12") == "12"
    assert final_answer("12") is None
    assert final_answer("x:") == ""


@pytest.mark.parametrize(
    "task, prompt, answer, demonstration",
    [
        ("add2", "47+38=", "85", "7+8=15,4+3+1=8:85"),
        ("add2", "99+99=", "198", "9+9=18,9+9+1=19:198"),
        ("add2", "10+20=", "30", "0+0=0,1+2+0=3:30"),
        ("add3", "123+989=", "1112", "3+9=12,2+8+1=11,1+9+1=11:1112"),
        ("mul2", "47*38=", "1786", "47*8=376,47*30=1410:1786"),
        ("mul2", "12*10=", "120", "12*0=0,12*10=120:120"),
        ("add1", "7+8=", "15", "15"),
        ("add1", "1+1=", "2", "2"),
    ],
)
def test_demonstrations_earn_full_reward(task, prompt, answer, demonstration):
    t = get_task(task)
    problem = Problem(prompt, answer)
    assert t.demonstration(problem) == demonstration
    assert t.reward(problem, demonstration) == 1.0
    assert len(CharCodec().encode(demonstration)) + 1 <= t.max_new_tokens


@pytest.mark.parametrize("name", [n for n in task_names() if not n.startswith("perm3")])  # no arithmetic: test_perm3*.py
def test_problems_are_seeded_and_correct(name):
    task = get_task(name)
    a = task.problems(50, torch.Generator().manual_seed(3))
    b = task.problems(50, torch.Generator().manual_seed(3))
    assert a == b
    for p in a:
        op = "+" if "+" in p.prompt else "*"
        x, y = (int(v) for v in p.prompt.rstrip("=").split(op))
        assert int(p.answer) == (x + y if op == "+" else x * y)
        assert task.reward(p, task.demonstration(p)) == 1.0
        assert len(CharCodec().encode(task.demonstration(p))) + 1 <= task.max_new_tokens


def test_held_out_split_is_disjoint_and_fixed():
    task = get_task("add2")
    held = held_out_problems(task, 100)
    assert held == held_out_problems(task, 100)
    assert len({p.prompt for p in held}) == 100
    assert all(is_held_out(p) for p in held)
    train = training_problems(task, 500, torch.Generator().manual_seed(0))
    assert len(train) == 500
    assert not {p.prompt for p in train} & {p.prompt for p in held}


def test_codec_round_trip_and_specials():
    codec = CharCodec()
    ids = codec.encode("47+38=")
    assert codec.decode(ids) == "47+38="
    assert codec.decode(ids + [codec.eos_id, codec.pad_id]) == "47+38="
    assert codec.token_text(codec.eos_id) == "<eos>"
    assert codec.token_text(codec.pad_id) == "<pad>"
    assert codec.token_text(codec.encode("7")[0]) == "7"
    with pytest.raises(ValueError, match="alphabet"):
        codec.encode("4a")


def test_unknown_task():
    with pytest.raises(ValueError, match="add2"):
        get_task("add9")
