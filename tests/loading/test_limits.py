"""Each limit on an objective: a value at the limit loads, one past it is refused with one line naming the limit.

Memory is measured with tracemalloc (Python allocations): the inputs that used to exhaust the stack
or memory (an alias bomb, deep nesting) stay far below a few MB.
"""

from __future__ import annotations

import tracemalloc

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.loading import LIMITS, parse_yaml
from rlstab.loading.limits import check_data


def nested_lists(levels: int) -> str:
    """``a: [[...]]``: the top mapping is level 1, so ``levels - 1`` lists."""
    return "a: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"


def test_nesting_at_the_limit_loads_and_one_past_is_refused():
    assert parse_yaml(nested_lists(LIMITS.depth), "f")
    with pytest.raises(ConfigError) as info:
        parse_yaml(nested_lists(LIMITS.depth + 1), "f")
    # 'a: ' is columns 1-3, the 31 lists at the limit open at columns 4-34, the 32nd at column 35
    assert str(info.value) == "f: line 1, column 35: nested deeper than 32 levels (the limit on nesting)"


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 100_000,
        "a: " + "{a: " * 60_000,
        "".join(" " * i + "a:\n" for i in range(700)),  # an indented block mapping, 700 levels
        "- " * 50_000 + "x\n",
    ],
    ids=["flow lists", "flow mappings", "block mappings", "block lists"],
)
def test_deep_nesting_is_refused_without_recursion(text):
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="nested deeper than 32 levels"):
            rlstab.load(text[: LIMITS.bytes])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20


def test_keys_at_the_limit_load_and_one_past_is_refused():
    keys = "".join(f"k{i}: 1\n" for i in range(LIMITS.keys))
    assert len(parse_yaml(keys, "f")) == LIMITS.keys
    with pytest.raises(ConfigError) as info:
        rlstab.load(keys + "extra: 1\n" + "".join(f"x{i}: 1\n" for i in range(150_000))[: LIMITS.bytes // 2])
    # the 257th key is on line 257
    assert str(info.value) == "<yaml text>: line 257, column 1: a mapping of more than 256 keys (the limit on keys)"


def test_items_at_the_limit_load_and_one_past_is_refused():
    items = ", ".join(["1"] * LIMITS.items)
    assert len(parse_yaml(f"a: [{items}]\n", "f")["a"]) == LIMITS.items
    with pytest.raises(ConfigError) as info:
        parse_yaml(f"a: [{items}, 2]\n", "f")
    # 'a: [' is 4 columns, then 256 items of 3 columns ('1, '): the 257th starts at 4 + 256 * 3 + 1
    assert str(info.value) == "f: line 1, column 773: a list of more than 256 items (the limit on list items)"


def bomb(levels: int, width: int = 10) -> str:
    """A "billion laughs": each level is a list of ``width`` aliases of the one before."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once_and_small():
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="more than 10,000 values, counting each alias in full"):
            rlstab.load(bomb(levels=9))  # 10**9 values if expanded
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * 2**20


def test_aliases_up_to_the_limit_load():
    # l0: 11 values (the list and 10 scalars), l1: 1 + 10 * 11 = 111, l2: 1111, plus 3 keys: 1236
    data = parse_yaml(bomb(levels=3), "f")
    assert len(data["l2"]) == 10 and data["l2"][9][9] == ["x"] * 10
    values = 3 + 11 + 111 + 1111
    assert values <= LIMITS.values < values + 10 * 1111 + 1 + 1  # a fourth level would pass the limit
    with pytest.raises(ConfigError, match="the limit on values"):
        parse_yaml(bomb(levels=4), "f")


def test_an_anchor_on_a_scalar_counts_once_per_use():
    text = "s: &s abc\n" + "".join(f"k{i}: [" + ", ".join(["*s"] * 200) + "]\n" for i in range(49))
    assert len(parse_yaml(text, "f")) == 50  # 1 + 1 + 49 * (1 + 1 + 200) = 9,900 values
    with pytest.raises(ConfigError, match="the limit on values"):
        parse_yaml(text + "k49: [" + ", ".join(["*s"] * 200) + "]\n", "f")  # 10,102


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"a": {"b": {"c": 1}}}, None),
        ({1: "x"}, "<top level>: key 1 is not text; keys are field names"),
        ({"masks": [{("a",): 1}]}, "masks[0]: key ('a',) is not text"),
        ({f"k{i}": 1 for i in range(LIMITS.keys + 1)}, "<top level>: a mapping of 257 keys; at most 256 are allowed"),
        ({"masks": list(range(LIMITS.items + 1))}, "masks: a list of 257 items; at most 256 are allowed"),
        ({"a": [[[1]] * 200] * 200}, "more than 10,000 values"),
    ],
)
def test_a_python_dict_is_held_to_the_same_limits(data, problem):
    if problem is None:
        check_data(data, "<dict>")
        return
    with pytest.raises(ConfigError) as info:
        rlstab.load(data)
    assert str(info.value) == f"<dict>: {problem}" or problem in str(info.value)


def test_a_dict_that_contains_itself_is_refused():
    data = {"extends": "grpo", "masks": []}
    data["masks"].append(data)
    with pytest.raises(ConfigError, match=r"nested deeper than 32 levels \(the limit on nesting; or a structure that contains itself\)"):
        rlstab.load(data)
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ConfigError, match="<dict>: a.a.a.a"):
        rlstab.load(deep)
