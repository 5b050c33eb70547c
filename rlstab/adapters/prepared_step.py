"""The statistics of the optimizer step a trainer is running: set by an adapter's step scope, read by its loss.

veRL and OpenRLHF call the loss one micro-batch at a time, inside a trainer method that runs the
whole optimizer step. The adapter's step scope wraps that method, gathers the step's statistics
before its first micro-batch and sets them here for the duration of the step; the loss reads them.
A context variable, so that nothing global outlives the step and the loss need not import the step
scope (which asks whether a trainer's loss is rlstab's, and so imports the loss).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlstab.adapters.global_counts import Counted
    from rlstab.compiled import StepStats


@dataclass(frozen=True)
class PreparedStep:
    """One optimizer step's statistics, gathered over all its micro-batches and ranks.

    Attributes:
        stats: what [`gather`][rlstab.CompiledObjective.gather] returned.
        counted: what the trainer's counts count over the same micro-batches and ranks, when the
            objective rejects tokens into padding ([`counted`][rlstab.adapters.global_counts.counted]); else None.
    """

    stats: StepStats
    counted: Counted | None = None


_PREPARED: ContextVar[PreparedStep | None] = ContextVar("rlstab_prepared_step", default=None)


def prepared_step() -> PreparedStep | None:
    """The running optimizer step's statistics, or None outside a step the step scope prepared."""
    return _PREPARED.get()


@contextmanager
def preparing(step: PreparedStep | None) -> Iterator[None]:
    """Within it, ``prepared_step()`` is ``step`` (None: a step without prepared statistics)."""
    token = _PREPARED.set(step)
    try:
        yield
    finally:
        _PREPARED.reset(token)
