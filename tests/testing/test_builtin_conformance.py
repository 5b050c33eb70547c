"""Every built-in kind passes rlstab's conformance kit (``rlstab.testing``), check by check.

The cases come from the registry: every kind registered by the distribution ``rlstab`` needs at
least one instance in ``rlstab.testing.builtin_components()``, so a new built-in kind without an
example fails here instead of escaping the kit. The two-rank check runs every example in one
pair of spawned processes (starting them costs more than all the checks).
"""

import pytest

from rlstab.registry import registrations
from rlstab.testing import applicable_checks, builtin_components, builtin_kinds, missing_examples
from rlstab.testing.hosting import family_name
from rlstab.testing.pytest_plugin import conformance_cases

EXAMPLES = builtin_components()



def test_every_builtin_kind_has_an_example():
    assert not missing_examples(EXAMPLES), (
        f"built-in kinds without an example in rlstab.testing.builtin_components(): {missing_examples(EXAMPLES)}"
    )


def test_the_examples_are_builtin_kinds():
    builtin = {(family, kind) for family, kinds in builtin_kinds().items() for kind in kinds}
    assert builtin == {(r.family, r.kind) for r in registrations() if r.distribution == "rlstab"}
    assert {(family_name(c), c.kind) for c in EXAMPLES} <= builtin


def test_every_family_has_its_checks():
    by_family = {}
    for c in EXAMPLES:
        by_family.setdefault(family_name(c), set()).update(applicable_checks(c))
    assert "silenced_tokens_get_zero_gradient" in by_family["masks"]
    for family in ("sampler", "rollout"):
        assert "padding_changes_nothing" not in by_family[family] and "state_round_trip" in by_family[family]
    for family in set(by_family) - {"sampler", "rollout"}:
        assert {"padding_changes_nothing", "micro_batches_equal_whole_step", "two_ranks_equal_one_process"} <= by_family[family]
    stateful = {c.kind for c in EXAMPLES if "state_round_trip" in applicable_checks(c)}
    assert stateful == {"stare", "bapo", "goldilocks", "deep-grpo", "adaptive_entropy"}


@pytest.mark.parametrize(("component", "check"), conformance_cases(EXAMPLES))
def test_builtin_component_passes(component, check):
    check(component)
