"""An unknown kind: a small family's kinds are listed; a large one's closest kinds are named, with where to see all."""

import pytest

import rlstab
from rlstab.errors import ConfigError
from rlstab.registry import registrations


def problem(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        rlstab.load(text)
    (line,) = err.value.problems
    return line


def test_a_small_family_lists_its_kinds():
    kinds = sorted(r.kind for r in registrations("aggregation"))
    assert len(kinds) <= 8
    line = problem("extends: grpo\naggregation: {kind: token-means}\n")
    assert line == "aggregation.kind = 'token-means': unknown kind; allowed: " + ", ".join(map(repr, kinds))


def test_a_large_family_names_the_closest_kinds_and_the_listing():
    count = len(registrations("surrogate"))
    assert count > 8
    line = problem("extends: grpo\nsurrogate: {kind: cispoo}\n")
    assert line == (
        f"surrogate.kind = 'cispoo': unknown kind; did you mean 'cispo'? `rlstab components --family surrogate` lists its {count} kinds"
    )
    far = problem("extends: grpo\nsurrogate: {kind: zzzz}\n")
    assert far == f"surrogate.kind = 'zzzz': unknown kind; `rlstab components --family surrogate` lists its {count} kinds"
