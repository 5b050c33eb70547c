"""Components with one deliberate defect each, and one without, for tests/testing/test_kit_catches_defects.py.

A module of its own, at the top level of an importable folder, so that the ranks the two-rank
check spawns can import these classes (the test puts this folder on ``sys.path``; a rank registers
a class it does not know). Every kind starts with ``kit-`` so it cannot collide with a real one; the
test registers them (``COMPONENTS``) for its own duration only.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field

from rlstab.components import ComponentState
from rlstab.masks.base import Mask, below
from rlstab.regularisers.base import Regulariser
from rlstab.reweighters.base import Reweighter
from rlstab.step.base import RewardShaping


class WellBehavedMask(Mask):
    """Control: keep iff the probability is at least ``tau`` (a token-local rule: nothing to break)."""

    kind: Literal["kit-well-behaved"] = "kit-well-behaved"
    tau: float = Field(0.01, gt=0.0, lt=1.0)

    def keep(self, t, threshold):
        return 1.0 - below(t.logprobs, math.log(self.tau))

    def describe(self) -> str:
        return f"kit-well-behaved: keep iff p >= {self.tau:g}"


class RowMeanMask(Mask):
    """Reads padding: keep iff the entropy is below its row's mean over *every* position, padding included."""

    kind: Literal["kit-row-mean"] = "kit-row-mean"
    reads = frozenset({"entropy"})

    def keep(self, t, threshold):
        return below(t.entropy, t.entropy.mean(-1, keepdim=True))

    def describe(self) -> str:
        return "kit-row-mean: keep iff H < the row's mean H"


class NaNLeakingMask(Mask):
    """Reads padding and leaks its NaN: the indicator is scaled by S / S, S the row's entropy sum over every
    position, which overflows to inf or NaN when the padding holds huge values (then so does every token of the row)."""

    kind: Literal["kit-nan-leak"] = "kit-nan-leak"
    reads = frozenset({"entropy"})

    def keep(self, t, threshold):
        total = t.entropy.sum(-1, keepdim=True)
        return below(t.entropy, 1.5) * (total / total)

    def describe(self) -> str:
        return "kit-nan-leak: keep iff H < 1.5"


class SoftMask(Mask):
    """Its silenced tokens still train: keep = 0.01 instead of 0 where the entropy exceeds 1.5."""

    kind: Literal["kit-soft"] = "kit-soft"
    reads = frozenset({"entropy"})

    def keep(self, t, threshold):
        return 1.0 - 0.99 * (1.0 - below(t.entropy, 1.5))

    def describe(self) -> str:
        return "kit-soft: keep iff H < 1.5 (almost)"


class MicroBatchMeanMask(Mask):
    """A step statistic computed per micro-batch, undeclared: keep iff the entropy is below the mean entropy of
    the micro-batch's valid tokens (a quantile_request would make it the step's)."""

    kind: Literal["kit-micro-batch-mean"] = "kit-micro-batch-mean"
    reads = frozenset({"entropy"})

    def keep(self, t, threshold):
        mean = (t.entropy * t.valid).sum() / t.valid.sum().clamp(min=1.0)
        return below(t.entropy, mean)

    def describe(self) -> str:
        return "kit-micro-batch-mean: keep iff H < the mean H of the micro-batch"


class RelativeLengthPenalty(RewardShaping):
    """A step-level family computing a micro-batch statistic: penalise responses longer than the mean length of
    the rows it is given (shaped_rewards runs once per micro-batch, so 'the rows' are a micro-batch's)."""

    kind: Literal["kit-relative-length"] = "kit-relative-length"

    def penalty(self, lengths):
        lengths = lengths.to(torch.float32)
        return -0.1 * (lengths - lengths.mean()).clamp(min=0.0)

    def describe(self) -> str:
        return "kit-relative-length: R -= 0.1 * max(0, |y| - mean |y|)"


class UndeclaredReadMask(Mask):
    """Reads ref_logprobs without declaring it."""

    kind: Literal["kit-undeclared-read"] = "kit-undeclared-read"

    def keep(self, t, threshold):
        return below(t.ref_logprobs, -1.0)

    def describe(self) -> str:
        return "kit-undeclared-read: keep iff log p_ref < -1"


class CounterState(ComponentState):
    steps: int = Field(ge=0)


class ForgetfulReweighter(Reweighter):
    """Stateful, and its load_state_dict loses the state: the weight grows with the steps seen, but a loaded
    state is replaced by the initial one."""

    kind: Literal["kit-forgetful"] = "kit-forgetful"
    state_model = CounterState

    def initial_state(self) -> dict[str, Any]:
        return {"steps": 0}

    def begin_step(self, sums, state):
        steps = (state or self.initial_state())["steps"] + 1
        return steps, {"steps": steps}

    def validated_state(self, label: str, state: Any) -> dict[str, Any]:
        super().validated_state(label, state)
        return self.initial_state()  # the defect

    def weights(self, t, step):
        return torch.full_like(t.logprobs, 1.0 + 0.1 * (step or 0))

    def describe(self) -> str:
        return "kit-forgetful: w = 1 + 0.1 * steps"


class TwoLineMask(Mask):
    """describe() returns two lines."""

    kind: Literal["kit-two-lines"] = "kit-two-lines"

    def keep(self, t, threshold):
        return torch.ones_like(t.logprobs)

    def describe(self) -> str:
        return "kit-two-lines: keep every token\n(a second line)"


class OutOfBoundsDefault(Mask):
    """A default outside the field's own bounds (pydantic does not validate defaults; the schema says le=1)."""

    kind: Literal["kit-bad-default"] = "kit-bad-default"
    tau: float = Field(5.0, gt=0.0, le=1.0)

    def keep(self, t, threshold):
        return 1.0 - below(t.logprobs, math.log(min(self.tau, 0.5)))

    def describe(self) -> str:
        return f"kit-bad-default: keep iff p >= {self.tau:g}"


class UnsavedField(Mask):
    """A field left out of its dump: YAML written from the objective loses it."""

    kind: Literal["kit-unsaved"] = "kit-unsaved"
    tau: float = Field(0.01, gt=0.0, lt=1.0, exclude=True)

    def keep(self, t, threshold):
        return 1.0 - below(t.logprobs, math.log(self.tau))

    def describe(self) -> str:
        return f"kit-unsaved: keep iff p >= {self.tau:g}"


class QuietlyLocalRegulariser(Regulariser):
    """Declares selection: micro_batch, in a family whose per-micro-batch computation is never reported
    (CompiledObjective.per_micro_batch() looks at masks, reweighters and the surrogate)."""

    kind: Literal["kit-local-regulariser"] = "kit-local-regulariser"
    coef: float = Field(0.1, ge=0.0, le=1.0)
    selection: Literal["micro_batch"] = "micro_batch"

    def term(self, batch, t):
        return batch.logprobs.to(torch.float32) - t.logprobs.mean()

    def describe(self) -> str:
        return f"kit-local-regulariser: + {self.coef:g} * Agg(logp - mean logp of the micro-batch)"


COMPONENTS = (
    WellBehavedMask, RowMeanMask, NaNLeakingMask, SoftMask, MicroBatchMeanMask, RelativeLengthPenalty, UndeclaredReadMask,
    ForgetfulReweighter, TwoLineMask, OutOfBoundsDefault, UnsavedField, QuietlyLocalRegulariser,
)
