r"""Lopti's two updates per step: the objective of each phase, for a trainer to compile and run in turn.

A mask decides which tokens train; it cannot run two updates. The [`lopti`][rlstab.masks.Lopti] mask
keeps one side of $\eta$, and [`lopti_phases`][rlstab.compiler.lopti_phases.lopti_phases] turns an
objective with it into the two objectives of a Lopti step. Every step, a trainer runs the phases
one after the other, each a complete update (its own gather, micro-batch losses, backward and
optimizer step)::

    low, high = (rlstab.compile(o) for o in lopti_phases(rlstab.load("lopti")))
    for loss_fn in (low, high):                       # low-probability tokens first
        batches = forward(policy, step_data)          # current log-probs: after the first phase's update
        stats = loss_fn.gather(batches)
        for mb in batches:
            loss_fn(mb, step=stats).loss.backward()
        optimizer.step(); optimizer.zero_grad()

Both phases keep the step's ``old_logprobs``, rewards and advantages; only the current
log-probabilities change between them. The partition uses $\pi_{old}$, so it is the same in both.
The procedure is the authors' (arXiv 2505.12929; github zhyang2226/AR-Lopti, ``ray_trainer.py``,
``seperate_updating``): two ``update_actor`` calls per step, each with the other phase's
advantages zeroed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.masks.lopti import Lopti

if TYPE_CHECKING:
    from rlstab.objective import Objective


def lopti_phases(objective: Objective) -> tuple[Objective, Objective]:
    """The two objectives of a Lopti step, in order: every ``lopti`` mask set to ``low``, then to ``high``.

    Raises ValueError when the objective has no ``lopti`` mask.
    """
    if not any(isinstance(m, Lopti) for m in objective.masks):
        raise ValueError(f"objective {objective.name or 'custom'!r} has no lopti mask to split into phases")

    def with_phase(phase: str) -> Objective:
        masks = [m.model_copy(update={"phase": phase}) if isinstance(m, Lopti) else m for m in objective.masks]
        return objective.model_copy(update={"masks": masks})

    return with_phase("low"), with_phase("high")
