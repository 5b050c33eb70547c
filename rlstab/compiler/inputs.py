"""A compiled loss's inputs: the batch checked against what the objective reads, and its tokens.

Every phase starts here: ``tokens(batch)`` checks that the batch carries every field a component
reads, and turns it into ``Tokens`` whose valid tokens are the response
tokens left after rollout rejection (masks with ``acts_on_valid``: their rejected tokens become
padding, and leave every population and denominator; evaluated in ``keeps``). ``checked_fields``
names the fields whose values must be sound on valid tokens (what ``offending_inputs`` checks).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING

from rlstab.advantages import Given
from rlstab.batch import BatchError, TokenBatch
from rlstab.compiler.keeps import without_rejected
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.compiler.plan import Plan
    from rlstab.objective import Objective


class Inputs:
    """The checks and the tokens of one objective's batches (``plan``: what its components read)."""

    def __init__(self, objective: Objective, plan: Plan):
        self.objective = objective
        self.plan = plan
        self.rejections = [objective.masks[i] for i in plan.rejections]
        self.warned_ignored_rewards = False
        self._checked: dict[tuple[bool, ...], list[str]] = {}

    def tokens(self, batch: TokenBatch) -> Tokens:
        """The batch's tokens, after the checks; rejected tokens are padding."""
        self.check(batch)
        t = Tokens.from_batch(batch, self.objective.log_ratio_clamp)
        without_rejected(t, self.rejections)
        return t

    def check(self, batch: TokenBatch) -> None:
        """Raise ``BatchError`` for a batch without a field that a component, or the estimator it needs, reads."""
        if not isinstance(batch, TokenBatch):
            raise BatchError(f"expected an rlstab.TokenBatch, got {type(batch).__name__}")
        for who, name in self.plan.reads:
            if getattr(batch, name) is None:
                raise BatchError(f"{who} reads TokenBatch.{name}, which this batch does not carry")
        if batch.advantages is not None and batch.rewards is not None and not self.plan.reads_rewards:
            self._warn_ignored_rewards()
        if batch.advantages is None:
            est = self.objective.advantage
            if isinstance(est, Given):
                raise BatchError("advantage (given) needs TokenBatch.advantages, which this batch does not carry")
            for name in sorted(est.reads):
                if getattr(batch, name) is None:
                    raise BatchError(
                        f"advantage ({est.kind}): the batch has no advantages, and estimating them needs "
                        f"TokenBatch.{name}, which it does not carry"
                    )

    def checked_fields(self, batch: TokenBatch) -> list[str]:
        """The fields of ``batch`` whose values must be finite on valid tokens: what the loss reads (found once
        for each combination of the optional fields it depends on)."""
        key = (batch.old_logprobs is not None, batch.advantages is not None, batch.is_weights is not None,
               batch.entropy is not None)
        if key not in self._checked:
            self._checked[key] = self._checked_fields(*key)
        return list(self._checked[key])

    def _checked_fields(self, old_logprobs: bool, advantages: bool, is_weights: bool, entropy: bool) -> list[str]:
        names = ["logprobs"]
        if old_logprobs:
            names.append("old_logprobs")
        names.append("advantages" if advantages else "rewards")
        if is_weights:
            names.append("is_weights")
        # a bool cannot be non-finite, nor can integer token ids (which hold no limits either)
        read = {f for _, f in self.plan.reads} - {"advantages", "is_branch", "token_ids"}
        if not advantages:
            read |= set(self.objective.advantage.reads) - {"rewards", "group_ids"}
        if entropy:
            read.add("entropy")  # reported as entropy/mean even when no component reads it
        return names + sorted(read)

    def _warn_ignored_rewards(self) -> None:
        """Once per compiled objective: a batch with advantages and rewards, whose rewards nothing reads."""
        if self.warned_ignored_rewards:
            return
        self.warned_ignored_rewards = True
        warnings.warn(
            f"objective {self.objective.name or 'custom'!r}: the batch carries both advantages and rewards; the "
            f"advantages take precedence, so the advantage estimator ({self.objective.advantage.kind}) does not run "
            "and the rewards are ignored (no component of this objective reads them). Leave rewards out of the "
            "TokenBatch, or leave advantages out to have them estimated. (Warned once per compiled objective.)",
            UserWarning,
            stacklevel=_caller_level(),
        )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside rlstab, as seen from a function that calls ``warnings.warn``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level
