"""The statistics of the optimizer step OpenRLHF is running, set by the step scope and read by the loss.

A module of its own so that the loss ([`loss`][rlstab.adapters.openrlhf.loss]) reads what the step
scope ([`step_scope`][rlstab.adapters.openrlhf.step_scope]) prepared without importing it: the step
scope asks whether a trainer's loss is rlstab's, so it imports the loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from rlstab.compiled import StepStats

_PREPARED: ContextVar[StepStats | None] = ContextVar("rlstab_openrlhf_prepared_step", default=None)


def prepared_step() -> StepStats | None:
    """The statistics of the optimizer step the running ``training_step`` belongs to, or None outside one."""
    return _PREPARED.get()


@contextmanager
def preparing(stats: StepStats | None) -> Iterator[None]:
    """Within it, ``prepared_step()`` is ``stats`` (None: a step without prepared statistics)."""
    token = _PREPARED.set(stats)
    try:
        yield
    finally:
        _PREPARED.reset(token)
