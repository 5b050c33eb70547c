"""The mask-slot rules read any object with masks and shadow masks: the data model's, the plan's, a stand-in's."""

from types import SimpleNamespace

from rlstab.mask_slots import component_labels, mask_slots, match_problems, matched_slot, shadow_labels


def mask(kind, **fields):
    return SimpleNamespace(kind=kind, **fields)


def test_labels_and_slots_of_a_stand_in():
    # Two s2t among three kinds: suffixed with their positions (0 and 2); the shadow s2t is alone: no suffix.
    assert component_labels(["s2t", "tis", "s2t"]) == ("s2t_0", "tis", "s2t_2")
    o = SimpleNamespace(masks=[mask("s2t"), mask("icepop"), mask("s2t")], shadow_masks=[mask("s2t")])
    assert shadow_labels(o) == ("shadow/s2t",)
    assert [label for label, _ in mask_slots(o)] == ["s2t_0", "icepop", "s2t_2", "shadow/s2t"]
    # A match by index counts only the masks (0..2); by label, any slot; else None.
    assert (matched_slot(o, 1), matched_slot(o, 3), matched_slot(o, "shadow/s2t"), matched_slot(o, "s2t")) == (1, None, 3, None)
    assert matched_slot(o, None) is None


def test_match_problems_of_a_stand_in():
    counted = mask("random_silence", counted=True, match="nothing")
    o = SimpleNamespace(masks=[mask("s2t"), counted], shadow_masks=[mask("rollout_rejection", acts_on_valid=True)])
    problems = match_problems(o)
    assert [path for path, _, _ in problems] == [("shadow_masks", 0), ("masks", 1, "match")]
    # Allowed: the slots that are not counted, the shadow rejection included (it is refused on its own line).
    assert "allowed: 's2t', 'shadow/rollout_rejection'" in problems[1][1]
    assert match_problems(SimpleNamespace(masks=[mask("s2t"), mask("random_silence", counted=True, match=0)],
                                          shadow_masks=[])) == []
