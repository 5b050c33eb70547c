"""How a check fails: one ``AssertionError`` naming the component (family, kind, class) and the check.

Every check runs inside ``checking``: an ``AssertionError`` raised by the check gets the prefix,
and any other exception (a component that raises ``TypeError`` on the kit's batch, a loss that
raises ``FloatingPointError``) becomes an ``AssertionError`` too, chained to the original, so a
plugin's test suite sees a failed check, not an error, and the message says which check and why.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rlstab.registry import family_of


def label(component) -> str:
    """``masks kind 's2t' (rlstab.masks.s2t.S2T)``: what a failure message names."""
    cls = type(component)
    fam = family_of(cls)
    family = fam.name if fam is not None else "component"
    return f"{family} kind {getattr(component, 'kind', '?')!r} ({cls.__module__}.{cls.__qualname__})"


@contextmanager
def checking(component, check: str) -> Iterator[None]:
    """Run a check's body; re-raise any failure as ``AssertionError('<label>: <check>: <why>')``."""
    try:
        yield
    except AssertionError as err:
        raise AssertionError(f"{label(component)}: {check}: {err}") from None
    except Exception as err:  # noqa: BLE001 - a component that raises fails the check, with the cause chained
        raise AssertionError(f"{label(component)}: {check}: raised {type(err).__name__}: {err}") from err
