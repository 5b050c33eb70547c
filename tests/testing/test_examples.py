"""rlstab.testing.examples: an instance of every built-in kind, configured so that the kit's checks exercise it."""

from rlstab.clipping.clip_cov import ClipCov
from rlstab.masks.s2t import S2T
from rlstab.registry import registrations
from rlstab.testing.examples import builtin_components, builtin_kinds, missing_examples
from rlstab.testing.hosting import family_name


def test_builtin_kinds_are_the_registered_rlstab_kinds_sorted_by_family():
    kinds = builtin_kinds()
    assert all(v == sorted(v) for v in kinds.values())
    assert {(f, k) for f, ks in kinds.items() for k in ks} == {
        (r.family, r.kind) for r in registrations() if r.distribution == "rlstab"
    }
    assert "s2t" in kinds["masks"] and "grpo" in kinds["advantage"]


def test_missing_examples_names_each_kind_without_an_instance():
    total = sum(len(v) for v in builtin_kinds().values())
    assert len(missing_examples([])) == total
    missing = missing_examples([S2T(), S2T(tau_p=0.01)])  # two instances of one kind: one kind covered
    assert "masks/s2t" not in missing and len(missing) == total - 1
    assert "masks/low_probability" in missing


def test_every_builtin_kind_has_an_example():
    assert missing_examples(builtin_components()) == []


def test_the_examples_are_fresh_instances():
    first, second = builtin_components(), builtin_components()
    assert first == second and all(a is not b for a, b in zip(first, second))


def test_the_departures_from_defaults_the_docstring_promises():
    examples = builtin_components()
    by_family = {}
    for c in examples:
        by_family.setdefault(family_name(c), []).append(c)
    # aggregations have no default count: both values appear
    assert {a.count for a in by_family["aggregation"]} == {"kept", "valid"}
    # regularisers at coef 0.1, so their term is not lost in the tolerances
    assert {r.coef for r in by_family["regularisers"]} == {0.1}
    # Clip-Cov with a seed (seed null draws from the global generator: nothing could be compared)
    clip_cov = [c for c in examples if isinstance(c, ClipCov)]
    assert clip_cov and all(c.seed is not None and c.fraction == 0.02 for c in clip_cov)
    veto = [c for c in by_family["masks"] if c.kind == "rollout_veto"]
    assert [v.threshold for v in veto] == [0.05]
