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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("extends: stapo\nmasks: [{kind: s2t, tau: 0.1}]\n", "masks[0].tau: unknown field (value 0.1); did you mean 'tau_p'?"),
        ("extends: grpo\naggregaton: {kind: token-mean}\n", "aggregaton: unknown field (value {'kind': 'token-mean'}); did you mean 'aggregation'?"),
        ("extends: dapo\nsurrogate: {eps_hgh: 0.3}\n", "surrogate.eps_hgh: unknown field (value 0.3); did you mean 'eps_high'?"),
        ("extends: grpo\nadvantage: {kind: grpo, normalise_std: true}\n", "advantage.normalise_std: unknown field (value True); did you mean 'normalize_std'?"),
        ("extends: grpo\nzzzz: 1\n", "zzzz: unknown field (value 1); check its spelling"),
    ],
)
def test_an_unknown_field_names_the_closest_fields_of_its_own_component(text, expected):
    assert problem(text) == expected


def test_the_closest_fields_are_those_of_the_kind_in_use():
    # 'tau_p' belongs to s2t, not to entropy_quantile: under entropy_quantile 'tau' is not answered with it.
    line = problem("extends: grpo\nmasks: [{kind: entropy_quantile, tau: 0.1}]\n")
    assert "tau_p" not in line


def test_a_regime_field_gets_its_closest_name_too():
    from rlstab.lab.regimes import load_regime

    with pytest.raises(ConfigError) as err:
        load_regime({"name": "x", "group_sze": 4})
    assert err.value.problems == ["group_sze: unknown field (value 4); did you mean 'group_size'?"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (".nan", "masks[0].tau_p = nan: not a finite number; input should be less than 1"),
        (".inf", "masks[0].tau_p = inf: not a finite number; input should be less than 1"),
        ("-.inf", "masks[0].tau_p = -inf: not a finite number; input should be greater than 0"),
        ("1.5", "masks[0].tau_p = 1.5: Input should be less than 1"),  # a finite number out of bounds, as before
    ],
)
def test_a_nan_in_a_bounded_field_is_called_not_finite(value, expected):
    assert problem(f"extends: stapo\nmasks: [{{kind: s2t, tau_p: {value}}}]\n") == expected


def test_a_nan_in_a_top_level_bound_is_called_not_finite():
    assert problem("extends: grpo\nlog_ratio_clamp: .nan\n") == (
        "log_ratio_clamp = nan: not a finite number; input should be less than or equal to 80"
    )
