"""rlstab.exploration.base: the rollout family (executed by a trainer) and the dual-stream family (in the loss)."""

from typing import Literal

import pytest

from rlstab.exploration.base import Rollout, StreamWeighting
from rlstab.exploration.deep_grpo import DeepGRPO
from rlstab.exploration.dual_stream import DualStream
from rlstab.registry import family_of


class NoExplorer(Rollout):
    kind: Literal["kit-no-explorer"] = "kit-no-explorer"


def test_the_families():
    assert family_of(DeepGRPO).name == "rollout" and family_of(NoExplorer).name == "rollout"
    assert family_of(DualStream).name == "dual_stream"
    assert issubclass(DualStream, StreamWeighting)


def test_a_rollout_without_an_explorer_says_so():
    with pytest.raises(NotImplementedError):
        NoExplorer().explorer(0)


def test_the_dual_stream_reads_the_branch_flag():
    assert StreamWeighting.reads == frozenset({"is_branch"})
    assert "is_branch" in DualStream(branch_weight=0.5).reads
