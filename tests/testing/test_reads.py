"""rlstab.testing.reads: ``reads`` is a frozenset of TokenBatch fields, and it is what the component reads."""

from typing import Literal

import pytest
import torch

import rlstab
from rlstab.masks.base import Mask, below
from rlstab.masks.s2t import S2T
from rlstab.registry import isolated
from rlstab.testing.reads import FIELDS, REQUIRED, check_reads_are_declared


class SetReadsMask(Mask):
    """Declares its reads as a set, not a frozenset."""

    kind: Literal["kit-set-reads"] = "kit-set-reads"
    reads = {"entropy"}

    def keep(self, t, threshold):
        return below(t.entropy, 1.0)

    def describe(self) -> str:
        return "kit-set-reads: keep iff H < 1"


class MisspeltReadsMask(Mask):
    """Declares a field TokenBatch does not have (``entropies``)."""

    kind: Literal["kit-misspelt-reads"] = "kit-misspelt-reads"
    reads = frozenset({"entropies"})

    def keep(self, t, threshold):
        return torch.ones_like(t.logprobs)

    def describe(self) -> str:
        return "kit-misspelt-reads: keep every token"


@pytest.fixture(scope="module", autouse=True)
def registered():
    with isolated():
        rlstab.register(SetReadsMask)
        rlstab.register(MisspeltReadsMask)
        yield


def test_the_fields_and_what_every_loss_reads():
    assert REQUIRED == {"logprobs", "response_mask"} and REQUIRED < FIELDS
    assert {"entropy", "ref_logprobs", "advantages", "rewards"} < FIELDS


def test_declared_reads_pass():
    check_reads_are_declared(S2T())


def test_reads_that_are_no_frozenset_fail():
    with pytest.raises(AssertionError, match="reads must be a frozenset of TokenBatch field names, got set"):
        check_reads_are_declared(SetReadsMask())


def test_reads_naming_no_field_fail():
    with pytest.raises(AssertionError, match=r"reads names \['entropies'\], which are not TokenBatch fields"):
        check_reads_are_declared(MisspeltReadsMask())
