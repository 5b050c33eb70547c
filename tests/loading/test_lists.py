"""Lists of components under ``extends:``: a list replaces and names what it drops, ``{append: [...]}`` adds,
``{replace: [...]}`` replaces without a note; every file of a chain by the same rule; the forms' errors in one line."""

from __future__ import annotations

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.loading.lists import Dropped, component_lists
from rlstab.masks import S2T, EntropyQuantile

NOTE = (
    "<yaml text>: note: masks replaces the masks of preset stapo, dropping s2t (masks[0]); to keep it, write "
    "masks: {append: [...]} with only the added ones; masks: {replace: [...]} replaces without this note"
)

# One component in each list of components, over which the tests below replace, append and replace on purpose.
PARENT = """aggregation: {kind: token-mean, count: valid}
masks: [{kind: s2t}]
shadow_masks: [{kind: low_probability}]
reweighters: [{kind: tis}]
regularisers: [{kind: kl, coef: 0.1}]
reward_shaping: [{kind: overlong}]
"""
ADDED = {  # a component of another kind for each list (reward_shaping has one kind: overlong, with other fields)
    "masks": "{kind: entropy_quantile}",
    "shadow_masks": "{kind: s2t}",
    "reweighters": "{kind: stare}",
    "regularisers": "{kind: entropy_bonus, coef: 0.01}",
    "reward_shaping": "{kind: overlong, max_length: 100, buffer: 10}",
}
PARENT_KINDS = {"masks": "s2t", "shadow_masks": "low_probability", "reweighters": "tis", "regularisers": "kl", "reward_shaping": "overlong"}


def kinds(objective, field: str = "masks") -> list[str]:
    return [c.kind for c in getattr(objective, field)]


def test_the_lists_are_the_objectives_list_fields():
    assert component_lists() == ("masks", "shadow_masks", "reweighters", "regularisers", "reward_shaping")


def test_a_list_that_drops_a_parents_component_says_so():
    objective = rlstab.load("extends: stapo\nmasks: [{kind: entropy_quantile}]\n")
    assert kinds(objective) == ["entropy_quantile"]  # replacement is still the rule: stapo's s2t is gone...
    assert objective.dropped == (Dropped("masks", ("s2t",), (0,), "preset stapo", "<yaml text>"),)  # ...and recorded
    assert [str(d) for d in objective.dropped] == [NOTE]


def test_a_component_of_the_same_kind_counts_as_kept_one_for_one(tmp_path):
    assert rlstab.load("extends: stapo\nmasks: [{kind: s2t, tau_p: 0.01}]\n").dropped == ()
    (tmp_path / "two.yaml").write_text(
        "extends: grpo\nmasks: [{kind: s2t}, {kind: s2t, tau_p: 0.01}, {kind: low_probability}]\n"
    )
    (tmp_path / "one.yaml").write_text("extends: two.yaml\nmasks: [{kind: s2t}, {kind: entropy_quantile}]\n")
    # the parent's s2t (masks[0]) is matched by the one s2t; its second s2t (masks[1]) and low_probability (masks[2]) are not
    (dropped,) = rlstab.load(tmp_path / "one.yaml").dropped
    assert (dropped.kinds, dropped.indices, dropped.parent) == (("s2t", "low_probability"), (1, 2), str(tmp_path / "two.yaml"))
    assert "dropping s2t (masks[1]), low_probability (masks[2]); to keep them," in str(dropped)


@pytest.mark.parametrize("field", list(ADDED))
def test_each_list_replaces_appends_and_replaces_on_purpose(tmp_path, field):
    (tmp_path / "parent.yaml").write_text(PARENT)
    parent, added = PARENT_KINDS[field], ADDED[field].split(",")[0].removeprefix("{kind: ").rstrip("}")
    listed = rlstab.load(f"extends: {tmp_path / 'parent.yaml'}\n{field}: [{ADDED[field]}]\n")
    assert kinds(listed, field) == [added]
    same = added == parent  # the same kind counts as kept: nothing dropped
    assert [(d.field, d.kinds, d.indices) for d in listed.dropped] == ([] if same else [(field, (parent,), (0,))])
    appended = rlstab.load(f"extends: {tmp_path / 'parent.yaml'}\n{field}: {{append: [{ADDED[field]}]}}\n")
    assert kinds(appended, field) == [parent, added] and appended.dropped == ()
    assert getattr(appended, field)[0] == getattr(rlstab.load(PARENT), field)[0]  # the parent's component, its fields kept
    replaced = rlstab.load(f"extends: {tmp_path / 'parent.yaml'}\n{field}: {{replace: [{ADDED[field]}]}}\n")
    assert kinds(replaced, field) == [added] and replaced.dropped == ()
    emptied = rlstab.load(f"extends: {tmp_path / 'parent.yaml'}\n{field}: []\n")  # an empty list drops them all
    assert getattr(emptied, field) == [] and [d.kinds for d in emptied.dropped] == [(parent,)]


def test_append_keeps_the_parents_components_with_their_fields():
    stapo = rlstab.load("stapo")
    objective = rlstab.load("extends: stapo\nmasks:\n  append:\n    - {kind: entropy_quantile, rho: 0.8}\n")
    assert kinds(objective) == ["s2t", "entropy_quantile"]
    assert objective.masks[0] == stapo.masks[0] and objective.masks[1].rho == 0.8
    assert objective.dropped == ()
    assert objective.surrogate == stapo.surrogate and objective.aggregation == stapo.aggregation


def test_a_chain_follows_the_rule_at_every_file(tmp_path):
    (tmp_path / "mid.yaml").write_text("extends: stapo\nmasks: [{kind: entropy_quantile}]\n")  # drops stapo's s2t
    (tmp_path / "add.yaml").write_text("extends: mid.yaml\nmasks: {append: [{kind: low_probability}]}\n")
    mid = str(tmp_path / "mid.yaml")
    added = rlstab.load(tmp_path / "add.yaml")
    assert kinds(added) == ["entropy_quantile", "low_probability"]  # mid's list, then its own
    assert added.dropped == (Dropped("masks", ("s2t",), (0,), "preset stapo", mid),)  # the note names mid.yaml
    (tmp_path / "both.yaml").write_text("extends: stapo\nmasks: {append: [{kind: entropy_quantile}]}\n")
    (tmp_path / "more.yaml").write_text("extends: both.yaml\nmasks: {append: [{kind: low_probability}]}\n")
    assert kinds(rlstab.load(tmp_path / "more.yaml")) == ["s2t", "entropy_quantile", "low_probability"]
    (tmp_path / "over.yaml").write_text("extends: both.yaml\nmasks: [{kind: low_probability}]\n")
    # over.yaml's list replaces both.yaml's merged [s2t, entropy_quantile]: both are dropped, named from both.yaml
    assert rlstab.load(tmp_path / "over.yaml").dropped == (
        Dropped("masks", ("s2t", "entropy_quantile"), (0, 1), str(tmp_path / "both.yaml"), str(tmp_path / "over.yaml")),
    )
    (tmp_path / "quiet.yaml").write_text("extends: both.yaml\nmasks: {replace: [{kind: low_probability}]}\n")
    assert rlstab.load(tmp_path / "quiet.yaml").dropped == ()


def test_a_file_that_extends_nothing_appends_to_the_empty_default():
    root = "aggregation: {kind: token-mean, count: valid}\n"
    assert kinds(rlstab.load(root + "masks: {append: [{kind: s2t}]}\n")) == ["s2t"]
    assert kinds(rlstab.load(root + "masks: {replace: [{kind: s2t}]}\n")) == ["s2t"]
    assert rlstab.load(root + "masks: [{kind: s2t}]\n").dropped == ()


def test_a_dict_with_component_objects_follows_the_same_rule():
    dropped = rlstab.load({"extends": "stapo", "masks": [EntropyQuantile()]}).dropped
    assert [(d.kinds, d.source) for d in dropped] == [(("s2t",), "<dict>")]
    kept = rlstab.load({"extends": "stapo", "masks": {"append": [EntropyQuantile()]}})
    assert kinds(kept) == ["s2t", "entropy_quantile"] and kept.dropped == ()
    assert rlstab.load({"extends": "stapo", "masks": [S2T()]}).dropped == ()


def test_the_note_is_not_part_of_what_the_objective_computes():
    noted = rlstab.load("extends: stapo\nmasks: [{kind: entropy_quantile}]\n")
    plain = rlstab.load(noted.to_yaml())
    assert noted.dropped and plain.dropped == ()
    assert noted == plain and noted.fingerprint() == plain.fingerprint()
    assert noted.to_yaml() == plain.to_yaml() and "dropped" not in noted.model_dump()


def test_no_shipped_preset_drops_a_component_without_saying_it_means_to():
    assert {name: rlstab.load(name).dropped for name in rlstab.preset_names()} == dict.fromkeys(rlstab.preset_names(), ())
    assert kinds(rlstab.load("stapo-probability-only")) == ["low_probability"]  # its replace: is on purpose


@pytest.mark.parametrize(
    "masks, problem",
    [
        ("{apend: [{kind: s2t}]}", "masks.apend: unknown key (value [{'kind': 's2t'}]); did you mean 'append'? masks takes "
         "a list (replacing the parent's), {append: [...]} or {replace: [...]}"),
        ("{extend: []}", "masks.extend: unknown key (value []); masks takes a list (replacing the parent's), "
         "{append: [...]} or {replace: [...]}"),
        ("{}", "masks = {}: give one of {append: [...]} (added to the parent's list) and {replace: [...]}"),
        ("{append: [], replace: []}", "masks = {'append': [], 'replace': []}: give one of {append: [...]} (added to the "
         "parent's list) and {replace: [...]}"),
        ("{append: 3}", "masks.append = 3: must be a list of components"),
        ("{replace: {kind: s2t}}", "masks.replace = {'kind': 's2t'}: must be a list of components"),
        ("{append: null}", "masks.append = None: must be a list of components"),
        # a problem in an added component names its place in the file, not in the merged list (masks[1])
        ("{append: [{kind: s2t, tau_p: 1.5}]}", "masks.append[0].tau_p = 1.5: Input should be less than 1"),
        ("{append: [{kind: s2t}, {kind: nope}]}", "masks.append[1].kind = 'nope': unknown kind; `rlstab components "
         "--family masks` lists its 12 kinds"),
        ("{replace: [{tau_p: 0.1}]}", "masks.replace[0]: a 'kind' field is required to say which component this is"),
    ],
)
def test_a_wrong_form_is_one_line_naming_the_path_and_value(masks, problem):
    with pytest.raises(ConfigError) as info:
        rlstab.load(f"extends: stapo\nmasks: {masks}\n")
    assert info.value.problems == [problem]


def test_an_error_in_the_parents_part_keeps_its_merged_path(tmp_path):
    (tmp_path / "bad.yaml").write_text("extends: grpo\nmasks: [{kind: s2t, tau_p: 1.5}]\n")
    (tmp_path / "child.yaml").write_text("extends: bad.yaml\nmasks: {append: [{kind: s2t, tau_p: 2.0}]}\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(tmp_path / "child.yaml")
    assert info.value.problems == [  # masks[0] is bad.yaml's (merged, as any inherited value), append[0] the file's own
        "masks[0].tau_p = 1.5: Input should be less than 1",
        "masks.append[0].tau_p = 2.0: Input should be less than 1",
    ]


def test_the_form_names_the_file_it_is_in_and_a_parent_list_that_is_not_one(tmp_path):
    (tmp_path / "mid.yaml").write_text("extends: stapo\nmasks: {apend: []}\n")
    (tmp_path / "child.yaml").write_text("extends: mid.yaml\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(tmp_path / "child.yaml")
    assert str(info.value).startswith(f"{tmp_path / 'mid.yaml'}: masks.apend: unknown key")
    (tmp_path / "three.yaml").write_text("extends: grpo\nmasks: 3\n")
    (tmp_path / "on3.yaml").write_text("extends: three.yaml\nmasks: {append: [{kind: s2t}]}\n")
    with pytest.raises(ConfigError) as info:
        rlstab.load(tmp_path / "on3.yaml")
    assert str(info.value) == f"{tmp_path / 'on3.yaml'}: masks.append: the masks it adds to is 3, not a list (in {tmp_path / 'three.yaml'})"


def test_appending_past_the_limit_on_list_items_is_refused(tmp_path):
    (tmp_path / "many.yaml").write_text("extends: grpo\nmasks:\n" + "  - {kind: s2t}\n" * 200)
    (tmp_path / "more.yaml").write_text("extends: many.yaml\nmasks:\n  append:\n" + "    - {kind: s2t}\n" * 57)
    with pytest.raises(ConfigError) as info:  # 200 + 57 = 257 > 256
        rlstab.load(tmp_path / "more.yaml")
    assert info.value.problems == ["masks.append: 200 items and 57 more; at most 256 are allowed (the limit on list items)"]
    (tmp_path / "fits.yaml").write_text("extends: many.yaml\nmasks:\n  append:\n" + "    - {kind: s2t}\n" * 56)
    assert len(rlstab.load(tmp_path / "fits.yaml").masks) == 256  # 200 + 56
