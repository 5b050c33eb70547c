"""pytest helpers: one test per (component, check), the two-rank check shared by all of them.

In a plugin's test suite::

    import pytest
    from rlstab.testing.pytest_plugin import conformance_cases

    @pytest.mark.parametrize(("component", "check"), conformance_cases([MyMask(threshold=0.3)]))
    def test_conformance(component, check):
        check(component)

Each case is a pytest parameter with an id such as ``masks-my_mask-padding_changes_nothing``, so a
failure names the kind and the check. The two-rank check spawns two processes; the cases share
one pair for all their components (``SharedTwoRanks``), run the first time one of them is
reached. Listing the module in ``pytest_plugins`` also provides the ``rlstab_check_component`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from rlstab.testing.checks import CHECKS, applicable_checks, check_component
from rlstab.testing.hosting import family_name
from rlstab.testing.ranks import two_rank_failures

TWO_RANKS = "two_ranks_equal_one_process"


class SharedTwoRanks:
    """The two-rank check of several components, run for all of them at once, on first use."""

    def __init__(self, components, host=None):
        self.components = list(components)
        self.host = host
        self._failures: dict[int, str] | None = None

    def __call__(self, component, *, host=None) -> None:
        if self._failures is None:
            self._failures = two_rank_failures(self.components, host=self.host)
        index = next(i for i, c in enumerate(self.components) if c is component)
        if index in self._failures:
            raise AssertionError(self._failures[index])


def component_ids(components) -> list[str]:
    """``family-kind``, with ``-2``, ``-3``... for further instances of a kind."""
    seen: dict[str, int] = {}
    ids = []
    for c in components:
        base = f"{family_name(c)}-{c.kind}"
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return ids


def conformance_cases(components: Iterable, *, checks: Iterable[str] | None = None, host=None) -> list:
    """``pytest.param(component, check)`` for every check that applies to each component (or only ``checks``)."""
    components = list(components)
    shared = SharedTwoRanks([c for c in components if TWO_RANKS in applicable_checks(c)], host)
    wanted = None if checks is None else set(checks)
    cases = []
    for component, ident in zip(components, component_ids(components)):
        for name in applicable_checks(component):
            if wanted is not None and name not in wanted:
                continue
            check = shared if name == TWO_RANKS else _bound(CHECKS[name][0], host)
            cases.append(pytest.param(component, check, id=f"{ident}-{name}"))
    return cases


def _bound(check, host):
    if host is None:
        return check

    def with_host(component):
        return check(component, host=host)

    with_host.__name__ = check.__name__
    return with_host


@pytest.fixture
def rlstab_check_component():
    """``rlstab.testing.check_component``, as a fixture."""
    return check_component
