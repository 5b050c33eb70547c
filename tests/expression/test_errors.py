"""``rlstab.expression.errors``: the one error of the expression language, with its column and a caret."""

from rlstab.expression.errors import ExpressionError


def test_the_line_is_the_problem_its_column_and_the_hint():
    err = ExpressionError("unknown name 'entropi'", "ratio > 1 and entropi < 2", 14, "did you mean 'entropy'?")
    assert err.column == 15  # offset 14, 1-based
    assert err.line == "unknown name 'entropi' at column 15 (did you mean 'entropy'?)"
    assert ExpressionError("division by zero", "1 / 0", 2).line == "division by zero at column 3"
    assert isinstance(err, ValueError)


def test_the_message_shows_the_expression_and_a_caret_under_the_column():
    err = ExpressionError("division by zero", "entropy > 1 / 0", 12)
    # the excerpt indented by 4; the caret after 4 + 12 = 16 spaces
    assert str(err) == "division by zero at column 13\n    entropy > 1 / 0\n" + " " * 16 + "^"


def test_whitespace_that_is_not_printable_becomes_a_space_so_the_caret_stays_put():
    err = ExpressionError("oops", "entropy >\n\t1", 11)
    assert str(err).splitlines()[1:] == ["    entropy >  1", "               ^"]  # 4 + 11 spaces


def test_a_long_expression_shows_a_window_around_the_column():
    text = "a" * 300
    err = ExpressionError("oops", text, 200)
    _, excerpt, caret = str(err).split("\n")
    # window of 100 from 200 - 50 = 150: "..." + 100 characters + "..."; the caret at 3 + (200 - 150) = 53
    assert excerpt == "    ..." + "a" * 100 + "..."
    assert caret == "    " + " " * 53 + "^"
    # near the end the window is the last 100 characters: start 300 - 100 = 200, no "..." after it
    _, excerpt, caret = str(ExpressionError("oops", text, 290)).split("\n")
    assert excerpt == "    ..." + "a" * 100 and caret == "    " + " " * (3 + 90) + "^"
