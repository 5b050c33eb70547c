"""The kit can fail: each deliberately defective component (tests/testing/kit_defects.py) is caught by the
check made for its defect, with a message naming the kind and the check, and a well-behaved one passes all."""

import importlib
import re
from pathlib import Path

import pytest

import rlstab
from rlstab.registry import isolated, registrations
from rlstab.testing import (
    check_component,
    check_describe_and_explain,
    check_json_schema,
    check_micro_batches_equal_whole_step,
    check_padding_changes_nothing,
    check_reads_are_declared,
    check_silenced_tokens_get_zero_gradient,
    check_state_round_trip,
    check_two_ranks_equal_one_process,
    check_yaml_round_trip,
)

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def defects():
    """The module of defective components, importable (also by spawned ranks) and registered while this
    module's tests run; the registrations are undone afterwards."""
    with pytest.MonkeyPatch.context() as mp, isolated():
        mp.syspath_prepend(str(HERE))
        module = importlib.import_module("kit_defects")
        for cls in module.COMPONENTS:
            rlstab.register(cls)
        yield module


# (class name, constructor arguments, the check that must catch it, a phrase of its message)
DEFECTS = [
    ("RowMeanMask", {}, check_padding_changes_nothing, "padding filled with"),
    ("NaNLeakingMask", {}, check_padding_changes_nothing, "FloatingPointError"),
    ("SoftMask", {}, check_silenced_tokens_get_zero_gradient, "exactly 0 or 1"),
    ("MicroBatchMeanMask", {}, check_micro_batches_equal_whole_step, "the whole batch"),
    ("RelativeLengthPenalty", {}, check_micro_batches_equal_whole_step, "the whole batch"),
    ("UndeclaredReadMask", {}, check_reads_are_declared, "does not declare in `reads`"),
    ("ForgetfulReweighter", {}, check_state_round_trip, "resumed after step"),
    ("TwoLineMask", {}, check_describe_and_explain, "must be one line"),
    ("OutOfBoundsDefault", {}, check_json_schema, "fails the JSON Schema"),
    ("UnsavedField", {"tau": 0.05}, check_yaml_round_trip, "the YAML loads as"),
    ("QuietlyLocalRegulariser", {}, check_micro_batches_equal_whole_step, "per_micro_batch() does not report"),
]


@pytest.mark.parametrize(("name", "kwargs", "check", "phrase"), DEFECTS, ids=[d[0] for d in DEFECTS])
def test_the_check_for_the_defect_fails(defects, name, kwargs, check, phrase):
    component = getattr(defects, name)(**kwargs)
    with pytest.raises(AssertionError) as caught:
        check(component)
    message = str(caught.value)
    assert f"kind {component.kind!r}" in message and check.__name__ in message, message
    assert phrase in message, message


@pytest.mark.parametrize(("name", "kwargs", "check", "phrase"), DEFECTS, ids=[d[0] for d in DEFECTS])
def test_check_component_reports_the_defect(defects, name, kwargs, check, phrase):
    component = getattr(defects, name)(**kwargs)
    checks = [c for c in _applicable(component) if c != "two_ranks_equal_one_process"]  # spawned once, below
    with pytest.raises(AssertionError, match=re.escape(check.__name__)):
        check_component(component, checks=checks)


def test_two_ranks_catch_a_micro_batch_statistic_and_pass_a_token_rule(defects):
    with pytest.raises(AssertionError) as caught:
        check_two_ranks_equal_one_process(defects.MicroBatchMeanMask(), defects.WellBehavedMask())
    message = str(caught.value)
    assert "kit-micro-batch-mean" in message and "check_two_ranks_equal_one_process" in message, message
    assert "kit-well-behaved" not in message, message


def test_a_well_behaved_component_passes_every_check(defects):
    check_component(defects.WellBehavedMask(), checks=[c for c in _applicable(defects.WellBehavedMask()) if "two_ranks" not in c])


def test_a_component_defined_in_a_function_cannot_reach_the_ranks(defects):
    class Local(defects.WellBehavedMask):
        pass

    with pytest.raises(AssertionError, match="cannot be imported by a spawned rank"):
        from rlstab.testing.ranks import case_of

        case_of(Local())


def test_state_round_trip_does_not_apply_to_a_stateless_component(defects):
    with pytest.raises(AssertionError, match="keeps no state"):
        check_state_round_trip(defects.WellBehavedMask())


def _applicable(component):
    from rlstab.testing import applicable_checks

    return applicable_checks(component)


def test_the_defect_kinds_are_registered_only_here(defects):
    kinds = {r.kind for r in registrations()}
    assert {cls.model_fields["kind"].default for cls in defects.COMPONENTS} <= kinds
    assert all(r.distribution is None for r in registrations() if r.kind.startswith("kit-"))
