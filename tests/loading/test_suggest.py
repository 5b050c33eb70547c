"""``rlstab.loading.suggest``: the fields accepted where a config names an unknown one, for "did you mean"."""

from rlstab.loading.suggest import close_fields, field_names_at
from rlstab.objective import Objective


def test_the_top_level_fields_of_an_objective():
    names = field_names_at(Objective, ())
    assert {"advantage", "masks", "surrogate", "aggregation", "regularisers", "name"} <= names
    assert "tau_p" not in names  # a mask's field, not the objective's


def test_a_list_item_of_a_family_is_any_registered_kind_and_a_tag_narrows_it():
    # masks[0]: every registered mask's fields; masks[0] tagged s2t (pydantic puts the tag in the location): S2T's
    assert {"tau_p", "silence", "keep", "kind"} <= field_names_at(Objective, ("masks", 0))
    s2t = field_names_at(Objective, ("masks", 0, "s2t"))
    assert "tau_p" in s2t and "silence" not in s2t


def test_a_location_that_leads_nowhere_has_no_fields():
    assert field_names_at(Objective, ("no_such_field",)) == set()
    assert field_names_at(Objective, ("name", "deeper")) == set()


def test_close_fields_answer_masks_tau_with_tau_p():
    assert close_fields(Objective, ("masks", 0, "s2t", "tau"), "tau") == ["tau_p"]
    assert close_fields(Objective, ("advantag",), "advantag") == ["advantage"]
    assert close_fields(Objective, ("surrogate", "ppo_clip", "eps_lo"), "eps_lo") == ["eps_low"]


def test_close_fields_need_a_model_and_a_string_key():
    assert close_fields(None, ("advantag",), "advantag") == []
    assert close_fields(Objective, (0,), 0) == []
    assert close_fields(Objective, ("zzzzzz",), "zzzzzz") == []  # nothing close
