"""rlstab.testing.compare: equality within rtol 1e-5, atol 1e-6, and messages that say where two results differ."""

import dataclasses

import pytest
import torch

from rlstab.metrics import Metrics
from rlstab.testing.compare import (
    ATOL,
    RTOL,
    assert_close,
    assert_grads_close,
    assert_same,
    differences,
    plain,
    step_metrics,
    summary,
)


def test_the_tolerances():
    assert (RTOL, ATOL) == (1e-5, 1e-6)


def test_assert_close_accepts_values_within_the_tolerance_and_nan_against_nan():
    # |1 - 1.00001| = 1e-5 <= atol + rtol * 1.00001 = 1e-6 + 1.00001e-5
    assert_close(torch.tensor([1.0, float("nan")]), torch.tensor([1.00001, float("nan")]), "x")
    assert_close(2.0, 2.0, "numbers")


def test_assert_close_names_the_count_the_index_and_both_values():
    # 1.001 vs 1.0: |diff| 1e-3 > 1e-6 + 1e-5 * 1.0 (the tolerance ~1.1e-5)
    with pytest.raises(AssertionError, match=r"^the loss: 1 value\(s\) differ at index \[1\]: 3\.5 instead of 3\.0$"):
        assert_close(torch.tensor([1.0, 3.5]), torch.tensor([1.0, 3.0]), "the loss")
    with pytest.raises(AssertionError, match=r"1\.001"):
        assert_close(1.001, 1.0, "a number")


def test_assert_close_refuses_another_shape():
    with pytest.raises(AssertionError, match=r"^g: shape \(2,\) instead of \(2, 1\)$"):
        assert_close(torch.zeros(2), torch.zeros(2, 1), "g")


def test_assert_grads_close_compares_every_field_or_the_first_rows():
    want = {"logprobs": torch.zeros(2, 3)}
    got = {"logprobs": torch.cat([torch.zeros(2, 3), torch.ones(1, 3)])}  # an extra padding row
    assert_grads_close(got, want, "step", rows=2)
    with pytest.raises(AssertionError, match="the gradient with respect to logprobs: shape"):
        assert_grads_close(got, want, "step")
    with pytest.raises(AssertionError, match=r"gradients of \['entropy', 'logprobs'\] instead of \['logprobs'\]"):
        assert_grads_close({**got, "entropy": torch.zeros(3, 3)}, want, "step")


@dataclasses.dataclass
class Stats:
    counts: dict
    values: tuple


class Hook:
    def __init__(self):
        self.w = torch.tensor(2.0)
        self._private = 1


def test_plain_turns_dataclasses_tuples_and_objects_into_dicts_lists_and_tensors():
    t = torch.tensor([1.0], requires_grad=True)
    out = plain(Stats(counts={1: t}, values=(None, True, 3)))
    assert set(out) == {"counts", "values"} and out["values"] == [None, True, 3]
    assert list(out["counts"]) == ["1"] and not out["counts"]["1"].requires_grad  # keys as str, tensors detached
    assert out["counts"]["1"] is not t
    assert set(plain(Hook())) == {"w"}  # private attributes left out


def test_differences_name_the_path_of_each_difference():
    actual = {"a": {"b": [1.0, 2.0, 3]}, "c": "x"}
    expected = {"a": {"b": [1.0, 2.5, 4]}, "c": "x"}
    assert differences(actual, expected) == ["a.b[1]: 2.0 instead of 2.5", "a.b[2]: 3 instead of 4"]


def test_differences_within_the_tolerance_are_none_but_a_bool_is_not_a_number():
    # 1 + 5e-6 against 1: within 1e-6 + 1e-5 * 1
    assert differences({"x": 1.000005, "n": float("nan")}, {"x": 1.0, "n": float("nan")}) == []
    assert differences({"x": True}, {"x": 1.0}) == ["x: True instead of 1.0"]
    assert differences({"x": 1.0}, {"x": 1.0}, rtol=0.0, atol=0.0) == []


def test_differences_in_structure():
    assert differences({"a": 1}, {"b": 1}) == ["<value>: {'a': 1} instead of {'b': 1}"]
    assert differences([1, 2], [1]) == [": [1, 2] instead of [1]"]
    assert differences(torch.tensor([1, 2]), torch.tensor([1, 3])) != []  # integer tensors: exactly equal or not
    assert differences(torch.tensor([1.0]), 1.0) == [": tensor([1.]) instead of 1.0"]


def test_assert_same_shows_five_differences_and_counts_the_rest():
    expected = {f"k{i}": 0.0 for i in range(7)}
    actual = {k: 1.0 for k in expected}
    with pytest.raises(AssertionError, match=r"^the step differ: k0: 1\.0 instead of 0\.0; .*k4: .* \(and 2 more\)$"):
        assert_same(actual, expected, "the step")
    assert_same(actual, dict(actual), "equal")


class FakeStats:
    counts = {"valid": 3, "world_size": 2}
    thresholds = [torch.tensor(0.5)]
    advantage = None
    hooks = {}
    step_level = {}
    branch_counts = {"branch": 1, "world_size": 2}


def test_summary_can_leave_the_world_size_out():
    full = summary(FakeStats())
    assert full["counts"] == {"valid": 3, "world_size": 2} and full["advantage"] is None
    assert set(full) == {"counts", "thresholds", "advantage", "hooks", "step_level", "branch_counts"}
    local = summary(FakeStats(), world_size=False)
    assert local["counts"] == {"valid": 3} and local["branch_counts"] == {"branch": 1}
    assert FakeStats.counts == {"valid": 3, "world_size": 2}  # the stats themselves are untouched


def test_step_metrics_are_those_that_combine_as_step():
    metrics = Metrics(["loss/pg", "step/kept", "entropy"], [1.0, 2.0, 3.0], kinds=["sum", "step", "token_mean"])
    assert step_metrics(metrics) == {"step/kept": 2.0}
