"""``rlstab.adapters.prepared_step``: a step's statistics, set for the step's duration and nowhere else."""

from __future__ import annotations

import contextvars
import dataclasses
import threading

import pytest

from rlstab.adapters.prepared_step import PreparedStep, prepared_step, preparing

# The statistics are held, never read, here: any object stands for a StepStats and a Counted.
STEP = PreparedStep(stats="stats of step 1")
OTHER = PreparedStep(stats="stats of step 2", counted="counts of step 2")


def test_outside_a_step_there_is_none():
    assert prepared_step() is None


def test_inside_preparing_the_step_is_the_one_given_and_is_gone_after():
    with preparing(STEP):
        assert prepared_step() is STEP
    assert prepared_step() is None


def test_nested_steps_restore_the_outer_one():
    with preparing(STEP):
        with preparing(OTHER):
            assert prepared_step() is OTHER
        assert prepared_step() is STEP
        with preparing(None):  # a step without prepared statistics hides the outer one
            assert prepared_step() is None
        assert prepared_step() is STEP
    assert prepared_step() is None


def test_a_failing_step_does_not_leave_its_statistics_behind():
    with pytest.raises(RuntimeError, match="out of memory"), preparing(STEP):
        raise RuntimeError("out of memory")
    assert prepared_step() is None


def test_another_thread_or_context_does_not_see_the_step():
    seen = []
    with preparing(STEP):
        thread = threading.Thread(target=lambda: seen.append(prepared_step()))
        thread.start()
        thread.join()
        assert contextvars.Context().run(prepared_step) is None
        assert contextvars.copy_context().run(prepared_step) is STEP  # a copy of this context does
    assert seen == [None]


def test_a_prepared_step_is_frozen_and_counts_nothing_by_default():
    assert STEP.counted is None and OTHER.counted == "counts of step 2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        STEP.stats = "changed"
