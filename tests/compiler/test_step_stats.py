"""``rlstab.compiler.step_stats``: a whole step's statistics, frozen, with the learning-rate factor of its step level."""

import dataclasses

import pytest

from rlstab.aggregation import StepCounts
from rlstab.compiler.step_stats import StepStats
from rlstab.step import StepLevel

COUNTS = StepCounts(5, 3, 3, 2, max_length=3, world_size=1)


def test_defaults_a_step_without_hooks_step_level_or_branch():
    stats = StepStats(COUNTS, (None,), None)
    assert stats.hooks == () and stats.step_level == StepLevel() and stats.branch_counts is None
    assert (stats.fingerprint, stats.objective_name) == ("", "")


def test_lr_scale_is_the_step_levels_and_one_without_it():
    assert StepStats(COUNTS, (), None).lr_scale == 1.0
    assert StepStats(COUNTS, (), None, step_level=StepLevel(lr_scale=0.25, ess=2.0, responses=8)).lr_scale == 0.25


def test_frozen_once_gathered():
    stats = StepStats(COUNTS, (), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.counts = StepCounts(1, 1, 1, 1, max_length=1, world_size=1)
