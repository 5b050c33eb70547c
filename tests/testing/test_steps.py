"""rlstab.testing.steps: five uneven micro-batches equal the whole step; a component that declares it selects
within each micro-batch (Clip-Cov) is held to the step's statistics only, and must be reported as such."""

from typing import Literal

import pytest

import rlstab
from rlstab.clipping.clip_cov import ClipCov
from rlstab.masks.base import Mask, below
from rlstab.masks.s2t import S2T
from rlstab.registry import isolated
from rlstab.testing.hosting import host_objective
from rlstab.testing.steps import SPLITS, check_micro_batches_equal_whole_step, declares_per_micro_batch


class MicroBatchMean(Mask):
    """keep iff H is below the mean H of the micro-batch's valid tokens: a step statistic taken per micro-batch."""

    kind: Literal["kit-steps-mean"] = "kit-steps-mean"
    reads = frozenset({"entropy"})

    def keep(self, t, threshold):
        mean = (t.entropy * t.valid).sum() / t.valid.sum().clamp(min=1.0)
        return below(t.entropy, mean)

    def describe(self) -> str:
        return "kit-steps-mean: keep iff H < the micro-batch's mean H"


@pytest.fixture(scope="module", autouse=True)
def registered():
    with isolated():
        rlstab.register(MicroBatchMean)
        yield


def test_the_split_covers_sixteen_rows_unevenly_with_one_empty_micro_batch():
    # (0,3) (3,8) (8,8) (8,12) (12,16): sizes 3, 5, 0, 4, 4, contiguous, 3 + 5 + 0 + 4 + 4 = 16
    assert all(a[1] == b[0] for a, b in zip(SPLITS, SPLITS[1:])) and SPLITS[0][0] == 0 and SPLITS[-1][1] == 16
    assert [hi - lo for lo, hi in SPLITS] == [3, 5, 0, 4, 4]


def test_declares_per_micro_batch():
    assert declares_per_micro_batch(host_objective(ClipCov(fraction=0.02, seed=0)), ClipCov(fraction=0.02, seed=0))
    assert not declares_per_micro_batch(host_objective(S2T()), S2T())


def test_a_token_local_and_a_declared_per_micro_batch_component_pass():
    check_micro_batches_equal_whole_step(S2T())
    check_micro_batches_equal_whole_step(ClipCov(fraction=0.02, seed=0))  # its loss depends on the split, as declared


def test_the_same_rule_undeclared_fails():
    with pytest.raises(AssertionError) as caught:
        check_micro_batches_equal_whole_step(MicroBatchMean())
    message = str(caught.value)
    assert message.startswith("masks kind 'kit-steps-mean' (") and "check_micro_batches_equal_whole_step: " in message
    assert "the whole batch" in message, message
