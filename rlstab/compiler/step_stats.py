"""The statistics of a whole optimizer step, frozen by ``gather`` before the micro-batch losses run."""

from __future__ import annotations

from dataclasses import dataclass

from rlstab.aggregation import StepCounts
from rlstab.lazy import torch
from rlstab.step import StepLevel


@dataclass(frozen=True)
class StepStats:
    """Statistics of a whole step, frozen before the micro-batch losses run.

    Attributes:
        counts: the denominators (kept and valid tokens and responses, padded length, world size).
        thresholds: one per mask, then one per shadow mask: its threshold (0-d tensor) or None; a
            tuple of them (each or None) for a mask whose ``quantile_request`` returns a list of
            requests; ``(m, n, cut, share)`` for a counted mask (``random_silence``).
        advantage: the fitted estimator state, or None when the batches carried advantages.
        hooks: one step value per reweighter, then one for the surrogate, then one per regulariser (``begin_step``'s result).
        branch_counts: with ``dual_stream``, the denominators of the branch stream's rows; those of
            the main stream are ``counts`` less these. None otherwise.
        step_level: the step-level decisions (groups dropped by dynamic sampling, the ESS scale).
        fingerprint: [`Objective.fingerprint`][rlstab.Objective.fingerprint] of the objective that
            gathered them: the loss of any objective with another fingerprint refuses them (a
            BatchError), since its masks, estimator and hooks would read them wrongly. The same
            objective compiled twice, or loaded under another name, has the same fingerprint.
        objective_name: that objective's name (``"custom"`` without one), for the message.
    """

    counts: StepCounts
    thresholds: tuple[torch.Tensor | None, ...]
    advantage: object | None
    hooks: tuple = ()
    step_level: StepLevel = StepLevel()
    fingerprint: str = ""
    objective_name: str = ""
    branch_counts: StepCounts | None = None

    @property
    def lr_scale(self) -> float:
        """The factor for this step's learning rate (the objective's ``lr_scale``, VCPO); 1.0 without one."""
        return self.step_level.lr_scale
