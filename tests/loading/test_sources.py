"""rlstab.load: the sources it accepts, ``extends``, and the ConfigErrors of bad YAML and bad fields."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import rlstab
from rlstab import ConfigError, Objective
from rlstab.clipping import NoClip, PPOClip
from rlstab.masks import S2T, EntropyQuantile, LowProbability


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# ----------------------------------------------------------------------------- sources


def test_preset_names_are_the_shipped_presets():
    names = rlstab.preset_names()
    assert {"grpo", "dapo", "dr_grpo", "justrl", "stapo", "20-entropy"} <= set(names)
    assert list(names) == sorted(names)


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_every_preset_loads_and_names_itself(name):
    objective = rlstab.load(name)
    assert isinstance(objective, Objective)
    assert objective.name == name
    assert objective.description


def test_stapo_preset_values():
    o = rlstab.load("stapo")
    assert o.masks == [S2T(tau_p=0.002, entropy_quantile=0.8)]
    assert o.surrogate == PPOClip(eps_low=0.2, eps_high=0.28, dual_clip=10.0)
    assert o.aggregation.kind == "token-mean" and o.aggregation.count == "kept"


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_to_yaml_round_trips(name):
    objective = rlstab.load(name)
    text = objective.to_yaml()
    assert not any(line.startswith("extends") for line in text.splitlines())  # fully resolved
    again = rlstab.load(text)
    assert again == objective
    assert again.to_yaml() == text


def test_load_yaml_file_as_str_and_path(tmp_path):
    path = write(
        tmp_path / "mine.yaml",
        """
        name: mine
        masks:
          - {kind: low_probability, tau_p: 0.01}
        surrogate: {kind: none}
        aggregation: {kind: seq-mean-token-mean, count: valid}
        """,
    )
    from_path = rlstab.load(path)
    from_str = rlstab.load(str(path))
    assert from_path == from_str
    assert from_path.name == "mine"
    assert from_path.masks == [LowProbability(tau_p=0.01)]
    assert from_path.surrogate == NoClip()
    assert from_path.aggregation.kind == "seq-mean-token-mean"


def test_load_yml_suffix(tmp_path):
    path = write(tmp_path / "short.yml", "extends: grpo\nname: short\n")
    assert rlstab.load(str(path)).name == "short"


def test_load_yaml_text():
    o = rlstab.load("extends: grpo\nname: from-text\nsurrogate: {kind: none}\n")
    assert o.name == "from-text"
    assert o.surrogate == NoClip()
    assert o.aggregation == rlstab.load("grpo").aggregation


def test_load_dict_and_objective():
    data = {
        "name": "d",
        "masks": [{"kind": "entropy_quantile", "rho": 0.5}],
        "aggregation": {"kind": "token-mean", "count": "valid"},
    }
    o = rlstab.load(data)
    assert o.masks == [EntropyQuantile(rho=0.5)]
    assert data["masks"] == [{"kind": "entropy_quantile", "rho": 0.5}]  # input not mutated
    assert rlstab.load(o) is o


def test_load_dict_with_extends_does_not_mutate_input():
    data = {"extends": "dapo", "surrogate": {"eps_high": 0.3}}
    o = rlstab.load(data)
    assert o.surrogate.eps_high == 0.3
    assert data == {"extends": "dapo", "surrogate": {"eps_high": 0.3}}


def test_load_rejects_other_types():
    with pytest.raises(TypeError, match="int"):
        rlstab.load(3)


def test_load_unknown_name_is_config_error():
    with pytest.raises(ConfigError) as info:
        rlstab.load("stapo2")
    assert "stapo2" in str(info.value)
    assert "stapo" in str(info.value).replace("stapo2", "")  # lists the presets


def test_load_missing_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        rlstab.load(missing)
    assert str(missing) in str(info.value)
    assert "no such file" in str(info.value)


# ----------------------------------------------------------------------------- extends


def test_extends_list_replaces_whole(tmp_path):
    # stapo-high-entropy's single mask has entropy_side: high; a list override replaces the
    # list, so the new mask gets s2t's defaults (entropy_side: low), not the base's fields.
    path = write(
        tmp_path / "x.yaml",
        """
        extends: stapo-high-entropy
        masks:
          - {kind: s2t, tau_p: 0.01}
        """,
    )
    o = rlstab.load(path)
    assert o.masks == [S2T(tau_p=0.01)]
    assert o.masks[0].entropy_side == "low"
    # everything else comes from the base
    base = rlstab.load("stapo-high-entropy")
    assert o.surrogate == base.surrogate and o.aggregation == base.aggregation


def test_extends_list_can_grow_and_shrink(tmp_path):
    two = rlstab.load(
        write(
            tmp_path / "two.yaml",
            """
            extends: stapo
            masks:
              - {kind: s2t}
              - {kind: entropy_quantile, rho: 0.5}
            """,
        )
    )
    assert [m.kind for m in two.masks] == ["s2t", "entropy_quantile"]
    none = rlstab.load(write(tmp_path / "none.yaml", "extends: stapo\nmasks: []\n"))
    assert none.masks == []


def test_extends_dict_merges_key_by_key():
    o = rlstab.load("extends: dapo\nsurrogate: {eps_high: 0.3}\n")
    assert o.surrogate == PPOClip(eps_low=0.2, eps_high=0.3, dual_clip=10.0)
    # nested objects of the base that are not mentioned are untouched
    dapo = rlstab.load("dapo")
    assert o.advantage == dapo.advantage and o.aggregation == dapo.aggregation


def test_extends_same_kind_explicit_merges():
    o = rlstab.load("extends: dapo\nsurrogate: {kind: ppo_clip, eps_low: 0.1}\n")
    assert o.surrogate == PPOClip(eps_low=0.1, eps_high=0.28, dual_clip=10.0)


def test_extends_changed_kind_replaces_component():
    o = rlstab.load("extends: dapo\nsurrogate: {kind: none}\n")
    assert o.surrogate == NoClip()
    o = rlstab.load("extends: dr_grpo\naggregation: {kind: token-mean, count: kept}\n")
    # `norm` belongs to seq-mean-token-sum-norm only; keeping it would be an unknown field
    assert o.aggregation.model_dump() == {"kind": "token-mean", "count": "kept"}


def test_extends_changed_kind_does_not_inherit_fields():
    # advantage grpo has normalize_std/eps; rloo has neither, so a merge would fail validation
    o = rlstab.load("extends: grpo\nadvantage: {kind: rloo}\n")
    assert o.advantage.kind == "rloo"


def test_extends_scalar_override_and_preset_chain():
    # stapo extends dapo extends grpo: three levels
    o = rlstab.load("extends: stapo\nname: mine\nlog_ratio_clamp: 10\n")
    assert o.name == "mine"
    assert o.log_ratio_clamp == 10.0
    assert o.advantage == rlstab.load("grpo").advantage
    assert o.masks == rlstab.load("stapo").masks


def test_extends_does_not_inherit_name_or_description():
    # a derived objective is not its parent
    o = rlstab.load("extends: stapo\nlog_ratio_clamp: 10\n")
    assert o.name is None and o.description is None
    o = rlstab.load("extends: stapo\ndescription: mine\n")
    assert o.name is None and o.description == "mine"
    assert o.masks == rlstab.load("stapo").masks


def test_extends_relative_file_is_relative_to_the_extending_file(tmp_path, monkeypatch):
    write(
        tmp_path / "base" / "base.yaml",
        """
        extends: dapo
        name: base
        surrogate: {eps_high: 0.3}
        """,
    )
    child = write(
        tmp_path / "configs" / "child.yaml",
        """
        extends: ../base/base.yaml
        name: child
        surrogate: {eps_low: 0.1}
        """,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # must not be resolved against the working directory
    o = rlstab.load(child)
    assert o.name == "child"
    assert o.surrogate == PPOClip(eps_low=0.1, eps_high=0.3, dual_clip=10.0)


def test_extends_relative_chain_of_files(tmp_path):
    write(tmp_path / "d" / "a.yaml", "extends: b.yaml\nname: a\n")
    write(tmp_path / "d" / "b.yaml", "extends: sub/c.yaml\ndescription: from b\n")
    write(tmp_path / "d" / "sub" / "c.yaml", "extends: stapo\nname: c\nlog_ratio_clamp: 5\n")
    o = rlstab.load(tmp_path / "d" / "a.yaml")
    assert (o.name, o.log_ratio_clamp) == ("a", 5.0)
    assert o.masks == rlstab.load("stapo").masks
    b = rlstab.load(tmp_path / "d" / "b.yaml")
    assert (b.description, b.log_ratio_clamp) == ("from b", 5.0)


def test_extends_file_from_dict_uses_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "base.yaml", "extends: justrl\nlog_ratio_clamp: 7\n")
    monkeypatch.chdir(tmp_path)
    o = rlstab.load({"extends": "base.yaml", "description": "x"})
    assert o.log_ratio_clamp == 7.0
    assert o.surrogate == rlstab.load("justrl").surrogate


def test_extends_circular_two_files(tmp_path):
    a = write(tmp_path / "a.yaml", "extends: b.yaml\nname: a\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\nname: b\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(a)
    message = str(info.value)
    assert "circular" in message
    assert "a.yaml" in message and "b.yaml" in message
    assert "->" in message


def test_extends_circular_self(tmp_path):
    a = write(tmp_path / "self.yaml", "extends: self.yaml\n")
    with pytest.raises(ConfigError, match="circular"):
        rlstab.load(a)


def test_extends_circular_through_differently_spelt_paths(tmp_path):
    # x -> ../d/y.yaml -> ../d/x.yaml: the same two files, named with ever longer relative paths
    x = write(tmp_path / "d" / "x.yaml", "extends: ../d/y.yaml\n")
    write(tmp_path / "d" / "y.yaml", "extends: ../d/x.yaml\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(x)
    assert "circular" in str(info.value)
    with pytest.raises(ConfigError, match="circular"):
        rlstab.load(x.resolve())


def test_extends_neither_preset_nor_file(tmp_path):
    path = write(tmp_path / "x.yaml", "extends: not-a-preset\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    message = str(info.value)
    assert str(path) in message
    assert "not-a-preset" in message
    assert "rlstab presets" in message  # says where the allowed names are (none is close to this one)


def test_misspelt_preset_suggests_the_closest(tmp_path):
    path = write(tmp_path / "x.yaml", "extends: stappo\n")
    with pytest.raises(ConfigError, match=r"extends = 'stappo': neither a preset \(did you mean 'stapo'"):
        rlstab.load(path)


def test_extends_missing_yaml_file(tmp_path):
    path = write(tmp_path / "x.yaml", "extends: nowhere.yaml\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    assert "nowhere.yaml" in str(info.value)


def test_extends_not_a_string():
    with pytest.raises(ConfigError, match="extends"):
        rlstab.load({"extends": ["stapo"]})


def test_error_in_extended_file_names_that_file(tmp_path):
    base = write(tmp_path / "base.yaml", "extends: stapo\nsurrogate: {eps_high: 0.3\nmasks: []\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(child)
    assert "base.yaml" in str(info.value)
    assert "line 3" in str(info.value)
    assert info.value.source == str(base)


# ----------------------------------------------------------------------------- bad YAML

BAD = {
    # name: (yaml text, substrings the message must contain)
    "unknown_kind": (
        "extends: stapo\nmasks:\n  - {kind: s2tt}\n",
        ["masks[0].kind", "s2tt", "did you mean 's2t'?", "rlstab components --family masks"],
    ),
    "misspelled_field": (
        "extends: stapo\nmasks:\n  - {kind: entropy_quantile, entropy_quantil: 0.3}\n",
        ["masks[0].entropy_quantil", "0.3"],
    ),
    "out_of_range": ("extends: stapo\nmasks:\n  - {kind: s2t, tau_p: 1.5}\n", ["masks[0].tau_p", "1.5"]),
    "wrong_type": ("extends: dapo\nsurrogate: {eps_high: abc}\n", ["surrogate.eps_high", "abc"]),
    "missing_required": ("name: x\naggregation: {kind: token-mean}\n", ["aggregation.count", "missing"]),
    "not_a_mapping": ("- grpo\n- dapo\n", ["<top level>", "mapping", "list"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_yaml_file(tmp_path, case):
    text, expected = BAD[case]
    path = write(tmp_path / f"{case}.yaml", text)
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    err = info.value
    message = str(err)
    assert err.source == str(path)
    assert message.startswith(f"{path}: ")
    for part in expected:
        assert part in message, (part, message)
    assert len(message) < 300
    assert "Traceback" not in message


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_yaml_text_and_dict(case):
    import yaml

    text, expected = BAD[case]
    with pytest.raises(ConfigError) as info:
        rlstab.load(text)
    assert info.value.source == "<yaml text>"
    for part in expected:
        assert part in str(info.value)
    data = yaml.safe_load(text)
    if isinstance(data, dict):
        with pytest.raises(ConfigError) as info:
            rlstab.load(data)
        assert info.value.source == "<dict>"
        for part in expected:
            assert part in str(info.value)


def test_misspelled_field_is_not_silently_ignored():
    with pytest.raises(ConfigError, match=r"surrogate\.eps_hihg"):
        rlstab.load("extends: dapo\nsurrogate: {eps_hihg: 0.5}\n")
    with pytest.raises(ConfigError, match=r"masking"):
        rlstab.load("extends: dapo\nmasking: []\n")


def test_several_problems_one_line_each():
    with pytest.raises(ConfigError) as info:
        rlstab.load("extends: stapo\nmasks:\n  - {kind: s2t, tau_p: 1.5, entropy_quantile: 0}\n")
    err = info.value
    assert len(err.problems) == 2
    assert len(str(err).splitlines()) == 2
    assert any("masks[0].tau_p" in p for p in err.problems)
    assert any("masks[0].entropy_quantile" in p for p in err.problems)


def test_missing_kind():
    with pytest.raises(ConfigError, match=r"masks\[0\].*kind"):
        rlstab.load("extends: stapo\nmasks:\n  - {tau_p: 0.1}\n")


def test_malformed_yaml_mentions_line(tmp_path):
    path = write(tmp_path / "m.yaml", "extends: dapo\nsurrogate: {eps_high: 0.3\nmasks: []\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "malformed YAML" in message
    assert "line 3" in message


def test_python_tag_refused_and_not_executed(tmp_path):
    marker = tmp_path / "hacked"
    text = f'extends: dapo\nname: !!python/object/apply:os.system ["touch {marker}"]\n'
    path = write(tmp_path / "evil.yaml", text)
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    message = str(info.value)
    assert str(path) in message
    assert "python/object/apply" in message
    assert "line 2" in message
    with pytest.raises(ConfigError):
        rlstab.load(text)
    # the tag also cannot hide in an extended base file
    write(tmp_path / "child.yaml", "extends: evil.yaml\n")
    with pytest.raises(ConfigError):
        rlstab.load(tmp_path / "child.yaml")
    assert not marker.exists()


def test_other_python_tags_refused(tmp_path):
    marker = tmp_path / "made"
    for tag in (
        f'!!python/object/new:os.system ["touch {marker}"]',
        "!!python/name:os.system",
        "!!python/tuple [1, 2]",
    ):
        with pytest.raises(ConfigError, match=r"line 2, column 7: YAML tag '!!python/(object/new|name|tuple)"):
            rlstab.load(f"extends: dapo\nname: {tag}\n")
    assert not marker.exists()


def test_duplicate_keys(tmp_path):
    path = write(tmp_path / "dup.yaml", "extends: dapo\nname: a\nname: b\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    message = str(info.value)
    assert str(path) in message
    assert "duplicate key 'name'" in message
    assert "line 3" in message


def test_duplicate_nested_keys():
    with pytest.raises(ConfigError, match="duplicate key 'tau_p'"):
        rlstab.load("extends: stapo\nmasks:\n  - kind: s2t\n    tau_p: 0.1\n    tau_p: 0.2\n")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "just a string: \n  - x\n- y"])
def test_empty_or_invalid_documents_are_config_errors(tmp_path, text):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        rlstab.load(path)
    assert str(path) in str(info.value)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)
    err = ConfigError("f.yaml", ["a: x", "b: y"])
    assert str(err) == "f.yaml: a: x\nf.yaml: b: y"
    assert err.source == "f.yaml" and err.problems == ["a: x", "b: y"]


def test_objective_is_frozen():
    o = rlstab.load("stapo")
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        o.name = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        o.masks[0].tau_p = 0.5  # type: ignore[misc]


def test_union_alternatives_name_the_yaml_path_once():
    with pytest.raises(rlstab.ConfigError) as err:
        rlstab.load({"extends": "dr_grpo", "aggregation": {"norm": 0}})
    (line,) = str(err.value).splitlines()
    assert "aggregation.norm = 0:" in line and "greater than or equal to 1" in line and "max_length" in line


def test_numbers_are_not_coerced_from_booleans_or_strings():
    for bad in ("true", '"0.3"'):
        with pytest.raises(rlstab.ConfigError, match=r"surrogate\.eps_high"):
            rlstab.load(f"extends: dapo\nsurrogate: {{eps_high: {bad}}}\n")


def test_exponent_without_a_dot_is_a_float():
    # YAML 1.1 (PyYAML's default) reads 2e-3 as a string; objective files read it as a number.
    assert rlstab.load("extends: stapo\nmasks: [{kind: s2t, tau_p: 2e-3}]\n").masks[0].tau_p == 0.002
