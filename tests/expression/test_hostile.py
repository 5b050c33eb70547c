"""Hostile and malformed expressions: each is refused with a message that says what and where.

Columns are 1-based; each expected column is counted by hand in the comment beside it.
"""

import ast
import builtins
import contextlib
import importlib

import pytest

import rlstab
from rlstab.expression import MAX_DEPTH, MAX_LENGTH, ExpressionError, compile_expression
from rlstab.expression.program import compile_expression as cached_compile
from rlstab.objective import COMPILER

REFUSED = [
    # (expression, fragment of the message, column)
    ("__import__('os').system('id')", "names starting with '_' are not allowed", 1),
    ("__builtins__ > 0", "names starting with '_' are not allowed", 1),
    ("entropy.__class__ > 0", "attribute access ('.') is not allowed", 8),  # 'entropy' is columns 1-7
    ("os.system('rm -rf /')", "attribute access ('.') is not allowed", 3),  # 'os' is columns 1-2
    ("eval('1') < entropy", "unknown function 'eval'", 1),
    ("exec('x') < entropy", "unknown function 'exec'", 1),
    ("open('/etc/passwd') < entropy", "unknown function 'open'", 1),
    ("getattr(entropy, 'real') > 0", "unknown function 'getattr'", 1),
    ("breakpoint() or entropy < 1", "unknown function 'breakpoint'", 1),
    ("entropy(1) < 2", "'entropy' is a feature, not a function", 1),
    ("lambda x: x > 0", "'lambda' is not allowed", 1),
    ("min(entropy for x in y) < 1", "'for' is not allowed", 13),  # 'min(' 1-4, 'entropy' 5-11, ' ' 12
    ("[x for x in entropy]", "subscripts and lists ('[') are not allowed", 1),
    ("entropy[0] < 1", "subscripts and lists ('[') are not allowed", 8),
    ("entropy if advantage > 0 else 1", "'if' is not allowed", 9),  # 'entropy ' is columns 1-8
    ("x := 1", "':' is not allowed", 3),  # 'x' 1, ' ' 2
    ("'entropy' < 1", "strings are not allowed", 1),
    ('entropy < "1"', "strings are not allowed", 11),  # 'entropy < ' is columns 1-10
    ("{} < entropy", "'{' is not allowed", 1),
    ("entropy < 0.5; import os", "';' is not allowed", 14),  # 'entropy < 0.5' is columns 1-13
    ("entropy = 1", "'=' is not allowed; compare with '=='", 9),
    ("quantile(entropy, q=0.8) < entropy", "'=' is not allowed", 20),  # 'quantile(entropy, q' is 1-19
    ("entropy ** 2 > 1", "'**' (power) is not supported", 9),
    ("entropy > 0 & advantage > 0", "'&' is not allowed; write 'and'", 13),  # 'entropy > 0 ' is 1-12
    ("1e999 < entropy", "number '1e999' is out of range", 1),
    ("entropy < 1e39", "number '1e39' is out of range", 11),  # float32 tops out at 3.4e38
    ("entropy < 1e-999", "number '1e-999' is too small", 11),
    ("entropy < 1e-46", "number '1e-46' is too small", 11),  # below the smallest float32 subnormal
    ("0x10 < entropy", "unexpected 'x' right after the number '0'", 2),
    ("entropy < 1.2.3", "unexpected '.' right after the number '1.2'", 14),  # '1.2' is columns 11-13
    ("(entropy < 1", "'(' is never closed", 1),
    ("entropy < 1)", "unmatched ')'", 12),
    ("min(entropy, 1 2) < 1", "expected ')' to close the '(' at column 4, found '2'", 16),  # 'min(entropy, 1 ' 1-15
    ("entropi < 0.5", "unknown name 'entropi' at column 1 (did you mean 'entropy'?)", 1),
    ("advantage > 0 and entropi < 1", "unknown name 'entropi' at column 19 (did you mean 'entropy'?)", 19),
    ("ENTROPY < 1", "did you mean 'entropy'?", 1),
    ("", "empty expression", 1),
    ("   \n\t ", "empty expression", 1),
    ("entropy and 0.3", "'and' needs a condition, but 'entropy' is a number", 1),
    ("entropy < 1 or 0.3", "'or' needs a condition, but '0.3' is a number", 16),  # 'entropy < 1 or ' is 1-15
    ("not entropy", "'not' needs a condition, but 'entropy' is a number", 5),
    ("(entropy < 1) + 2 > 0", "'+' needs a number, but 'entropy < 1' is a condition", 2),
    ("abs(entropy > 1) < 2", "abs() needs a number, but 'entropy > 1' is a condition", 5),
    ("entropy + 1", "the expression is a number, not a condition", 1),
    ("1 < 2", "the condition is always true", 1),
    ("entropy < 1 < 2", "chained comparisons are not supported", 13),  # 'entropy < 1 ' is 1-12
    ("entropy < 1 entropy > 0", "unexpected 'entropy' after a complete expression", 13),
    ("entropy < 1 and", "the expression ends where a value was expected", 16),  # one past the end (15 chars)
    ("True or entropy < 1", "'True' is not allowed", 1),
    ("entropy is 1", "'is' is not allowed", 9),
    ("log < 1", "'log' is a function", 1),
    ("log() < 1", "log() needs arguments", 5),  # the ')' at column 5
    ("abs(entropy, 1) < 1", "abs() takes 1 argument, got 2", 1),
    ("min(entropy) < 1", "min() takes at least 2 arguments, got 1", 1),
    ("min(entropy, ) < 1", "expected an argument after ','", 14),  # 'min(entropy, ' is 1-13
    ("quantile(entropy, 0.8, advantage > 0, 1) > 0", "quantile() takes 2 to 3 arguments, got 4", 1),
    ("1 / 0 < entropy", "division by zero", 3),
    ("exp(1000) < entropy", "the constant exp(1000) is not a finite float32 number", 1),
    ("log(0) < entropy", "the constant log(0) is not a finite float32 number", 1),
    ("entropy < 1e38 * 10", "the constant 1e+38 * 10 is not a finite float32 number", 11),
    ("quantile(entropy, 1.5) < entropy", "quantile()'s q must be a constant between 0 and 1, got '1.5'", 19),
    ("quantile(entropy, ratio) < entropy", "q must be a constant between 0 and 1", 19),
    ("quantile(entropy, quantile(entropy, 0.5)) > 0", "quantile() cannot be nested", 19),
    ("quantile(entropy, 0.5, entropy < quantile(entropy, 0.5)) > 0", "quantile() cannot be nested", 34),
    ("quantile(2, 0.5) < entropy", "quantile() of a constant", 10),
    ("quantile(entropy, 0.5, 1 > 2) < entropy", "population condition is always false", 24),
    ("entropy\x00 < 1", "unexpected character '\\x00' (U+0000)", 8),
    ("\u0435ntropy < 1", "unexpected character 'е' (U+0435)", 1),  # a Cyrillic 'е'
    ("entropy @ entropy > 0", "'@' is not allowed", 9),
    ("- entropy", "the expression is a number", 1),
    ("+entropy < 1", "unary '+' is not supported", 1),
]


@pytest.mark.parametrize(("text", "fragment", "column"), REFUSED, ids=[repr(r[0])[:40] for r in REFUSED])
def test_refused_with_message_and_column(text, fragment, column):
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    err = info.value
    assert fragment in str(err)
    assert err.column == column
    assert f"at column {column}" in str(err)
    # The caret sits under the column: line 3 is 4 spaces of indent, then column - 1 spaces.
    caret_line = str(err).splitlines()[2]
    assert caret_line == " " * (4 + column - 1) + "^"


def test_at_least_twenty_refusals():
    assert len(REFUSED) >= 20


def test_nesting_limit_is_exact():
    ok = "(" * MAX_DEPTH + "entropy < 1" + ")" * MAX_DEPTH
    compile_expression(ok)
    too_deep = "(" * (MAX_DEPTH + 1) + "entropy < 1" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(ExpressionError, match="nested too deeply") as info:
        compile_expression(too_deep)
    assert info.value.column == MAX_DEPTH + 1  # the 33rd '('


@pytest.mark.parametrize(
    "text",
    [
        "-" * 40 + "entropy < 0",  # unary minus
        "not " * 40 + "entropy < 0",  # not
        "abs(" * 40 + "entropy" + ")" * 40 + " < 1",  # calls
        "entropy" + " + entropy" * 40 + " < 1",  # a long left-deep sum
        "(" * 400 + "entropy < 1" + ")" * 400,  # would exhaust the Python stack without the limit
    ],
    ids=["unary", "not", "calls", "sum", "parentheses"],
)
def test_deep_trees_are_refused_before_the_stack_runs_out(text):
    with pytest.raises(ExpressionError, match=f"nested too deeply \\(more than {MAX_DEPTH} levels\\)"):
        compile_expression(text)


def test_length_limit_is_exact():
    ok = "entropy < 1".ljust(MAX_LENGTH)
    compile_expression(ok)
    with pytest.raises(ExpressionError, match=f"expression too long \\({MAX_LENGTH + 1} characters, at most {MAX_LENGTH}\\)"):
        compile_expression(ok + " ")
    with pytest.raises(ExpressionError, match="too long"):
        compile_expression("entropy < 1 and " * 100 + "entropy < 1")


def test_long_expressions_show_an_excerpt_around_the_column():
    text = "entropy < 1 and " * 20 + "entropi < 1"  # 320 characters of valid text, then the typo
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    _, excerpt, caret = str(info.value).splitlines()
    assert info.value.column == 321
    assert "..." in excerpt and len(excerpt) <= 4 + 3 + 100  # indent, "...", a 100-character window
    assert excerpt[len(caret) - 1 : len(caret) + 6] == "entropi"  # the caret is under the typo


def test_non_strings_are_a_type_error():
    with pytest.raises(TypeError, match="an expression is a string, not int"):
        compile_expression(3)


# ---------------------------------------------------------------- through rlstab.load: the YAML path


def test_load_names_the_yaml_path_and_the_column_on_one_line():
    yaml_text = """
aggregation: {kind: token-mean, count: kept}
masks:
  - kind: s2t
  - kind: expression
    silence: "advantage > 0 and entropi < 0.5"
"""
    with pytest.raises(rlstab.ConfigError) as info:
        rlstab.load(yaml_text)
    # One line per problem, as every ConfigError (the caret drawing is ExpressionError's own str)
    assert str(info.value) == (
        "<yaml text>: masks[1].silence = 'advantage > 0 and entropi < 0.5': "
        "unknown name 'entropi' at column 19 (did you mean 'entropy'?)"
    )


def test_load_reports_a_keep_expression_under_keep():
    with pytest.raises(rlstab.ConfigError, match=r"masks\[0\]\.keep = 'entropy and 0\.3': 'and' needs a condition"):
        rlstab.load({"aggregation": {"kind": "token-mean", "count": "kept"},
                     "masks": [{"kind": "expression", "keep": "entropy and 0.3"}]})


# ---------------------------------------------------------------- nothing is evaluated by Python


@contextlib.contextmanager
def no_python_evaluation():
    """Within the block, every way of running Python source records the call and fails.

    The originals are back before pytest reports anything (its reporting uses ``ast.parse``). One import by
    name is rlstab's own and names no input: ``Objective.compile()`` finding the compiler's module, the constant
    ``rlstab.objective.COMPILER`` (what a plain ``import`` statement did before; the one late-bound edge that
    tests/test_import_cycles.py declares). Every other module name is refused.
    """
    calls = []
    import_module = importlib.import_module
    import_module(COMPILER)  # loaded before the guard: a module's first import compiles its source (no .pyc yet)

    def forbidden(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"Python evaluation was called with {args!r}")

    def only_the_compiler(*args, **kwargs):
        return import_module(*args, **kwargs) if args == (COMPILER,) and not kwargs else forbidden(*args, **kwargs)

    targets = [(builtins, "eval"), (builtins, "exec"), (builtins, "compile"), (ast, "parse"),
               (importlib, "import_module")]
    saved = [getattr(module, name) for module, name in targets]
    cached_compile.cache_clear()  # so that every expression really goes through the parser
    try:
        for module, name in targets:
            setattr(module, name, only_the_compiler if name == "import_module" else forbidden)
        yield calls
    finally:
        for (module, name), original in zip(targets, saved):
            setattr(module, name, original)
        cached_compile.cache_clear()


def test_the_guard_refuses_every_import_by_name_but_the_compilers():
    with no_python_evaluation() as calls:
        with pytest.raises(AssertionError, match="'os'"):
            importlib.import_module("os")
        with pytest.raises(AssertionError, match="rlstab.compiled"):
            importlib.import_module(COMPILER, package="rlstab")
        assert importlib.import_module(COMPILER).__name__ == "rlstab.compiled"
    assert calls == [("os",), ("rlstab.compiled",)]


def test_valid_expressions_compile_and_run_without_python_evaluation(make_batch):
    batch = make_batch(seed=1)
    with no_python_evaluation() as calls:
        objective = rlstab.load({
            "aggregation": {"kind": "token-mean", "count": "kept"},
            "masks": [{"kind": "expression", "keep": "not (abs(advantage) * 2 > max(entropy, 1) or position + 1 >= "
                       "length / 2) or probability < exp(-3) and entropy < quantile(-logprob, 0.8, ratio > 0.5)"}],
        })
        out = objective.compile()(batch)
    assert calls == []
    assert 0 < out.metrics["mask/expression/kept"] < out.metrics["tokens/valid"]


@pytest.mark.parametrize(
    "payload",
    [
        "__import__('pathlib').Path({path!r}).touch() or entropy < 1",
        "open({path!r}, 'w') or entropy < 1",
        "entropy < 1 or __import__('os').system('touch {path}')",
        "(lambda: __import__('os').system('touch {path}'))() or entropy < 1",
        "[__import__('os').system('touch {path}') for _ in [1]] or entropy < 1",
    ],
)
def test_side_effect_payloads_never_run(payload, tmp_path):
    target = tmp_path / "pwned"
    text = payload.format(path=str(target))
    with no_python_evaluation() as calls:
        with pytest.raises(ExpressionError):
            compile_expression(text)
        with pytest.raises(rlstab.ConfigError):
            rlstab.load({"aggregation": {"kind": "token-mean", "count": "kept"},
                         "masks": [{"kind": "expression", "silence": text}]})
    assert calls == []
    assert not target.exists()
