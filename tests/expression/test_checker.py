"""``rlstab.expression.checker``: two types (numbers, conditions), constants folded in float64, and the refusals."""

import pytest

from rlstab.expression import ExpressionError, parse
from rlstab.expression.checker import check
from rlstab.expression.nodes import Call, Compare, Feature, Logical, Number
from rlstab.expression.printer import to_text


def checked(text):
    return check(parse(text), text)


def test_constants_fold_before_compiling():
    tree = checked("probability < 1 / 500")
    assert isinstance(tree, Compare) and isinstance(tree.right, Number)
    assert tree.right.value == 0.002  # 1 / 500 in float64
    assert checked("entropy > -(2 * 3) + exp(0)").right.value == -5.0  # -(6) + 1


def test_a_constant_condition_inside_and_or_is_dropped_or_decides():
    # "and" with an always-true part: that part goes; the rest is one comparison
    tree = checked("entropy > 1 and 2 > 1")
    assert isinstance(tree, Compare) and to_text(tree) == "entropy > 1"
    # "or" with an always-false part: that part goes, the "and" is left
    tree = checked("entropy > 1 and ratio < 2 or 1 > 2")
    assert isinstance(tree, Logical) and tree.op == "and" and to_text(tree) == "entropy > 1 and ratio < 2"


@pytest.mark.parametrize("text, problem, column", [
    ("entropy + 1", "the expression is a number, not a condition", 1),
    ("1 < 2", "the condition is always true: it depends on no token feature", 1),
    ("entropy > 1 or 2 > 1", "the condition is always true: it depends on no token feature", 1),
    ("entropy > 1 and not 2 > 1", "the condition is always false: it depends on no token feature", 1),
    ("entropy > 1 / 0", "division by zero", 13),
    ("entropy > log(0)", "the constant log(0) is not a finite float32 number", 11),
    ("entropy > exp(100)", "the constant exp(100) is not a finite float32 number", 11),  # e^100 > float32's max
    ("not entropy", "'not' needs a condition, but 'entropy' is a number", 5),
    ("(entropy > 1) + 1 > 0", "'+' needs a number, but 'entropy > 1' is a condition", 2),
])
def test_refusals_say_what_and_where(text, problem, column):
    with pytest.raises(ExpressionError) as info:
        checked(text)
    assert info.value.problem == problem and info.value.column == column


@pytest.mark.parametrize("text, problem", [
    ("entropy < quantile(quantile(entropy, 0.5), 0.5)", "quantile() cannot be nested inside another quantile()"),
    ("entropy < quantile(2, 0.5)", "quantile() of a constant"),
    ("entropy < quantile(entropy, 1.5)", "quantile()'s q must be a constant between 0 and 1, got '1.5'"),
    ("entropy < quantile(entropy, entropy)", "quantile()'s q must be a constant between 0 and 1, got 'entropy'"),
    ("entropy < quantile(entropy, 0.5, 1 > 2)", "quantile()'s population condition is always false"),
])
def test_quantile_arguments(text, problem):
    with pytest.raises(ExpressionError) as info:
        checked(text)
    assert info.value.problem == problem


def test_an_always_true_population_is_no_population():
    right = checked("entropy < quantile(entropy, 0.5, 2 > 1)").right
    assert isinstance(right, Call) and len(right.args) == 2  # (values, q): the condition dropped
    assert isinstance(right.args[0], Feature) and right.args[1].value == 0.5
    assert len(checked("entropy < quantile(entropy, 0.5, ratio > 1)").right.args) == 3
