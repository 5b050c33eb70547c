"""The parser's trees, the checker's folding and the canonical text, and what a program declares."""

import pytest

from rlstab.expression import FEATURES, compile_expression, parse
from rlstab.expression.lexer import tokenize
from rlstab.expression.nodes import Arithmetic, Call, Compare, Feature, Logical, Negate, Not, Number
from rlstab.expression.printer import to_text


def test_tokens_carry_their_offsets():
    toks = tokenize("entropy<=1.5e-3 and(p)")
    assert [(t.kind, t.text, t.offset) for t in toks] == [
        ("name", "entropy", 0), ("op", "<=", 7), ("number", "1.5e-3", 9), ("name", "and", 16),
        ("op", "(", 19), ("name", "p", 20), ("op", ")", 21), ("end", "", 22),
    ]
    assert toks[2].value == 0.0015


@pytest.mark.parametrize("literal, value", [("3", 3.0), ("0.25", 0.25), (".5", 0.5), ("5.", 5.0), ("2e3", 2000.0),
                                            ("2E+3", 2000.0), ("1e-3", 0.001), ("0e999", 0.0)])
def test_number_literals(literal, value):
    (number, _) = tokenize(literal)
    assert number.kind == "number" and number.value == value


def test_precedence_is_pythons():
    # a or (b and (not (c < d)))
    tree = parse("entropy > 1 or ratio > 1 and not logprob < -1")
    assert isinstance(tree, Logical) and tree.op == "or"
    right = tree.operands[1]
    assert isinstance(right, Logical) and right.op == "and"
    assert isinstance(right.operands[1], Not) and isinstance(right.operands[1].operand, Compare)
    # 1 + (2 * entropy), and unary minus binds tighter than *: (-entropy) * 2
    cmp = parse("1 + 2 * entropy > -entropy * 2")
    assert isinstance(cmp.left, Arithmetic) and cmp.left.op == "+" and cmp.left.right.op == "*"
    assert cmp.right.op == "*" and isinstance(cmp.right.left, Negate)


def test_arithmetic_is_left_associative():
    tree = parse("entropy - ratio - logprob > 0").left  # (entropy - ratio) - logprob
    assert tree.op == "-" and isinstance(tree.right, Feature) and tree.right.name == "logprob"
    assert tree.left.op == "-" and tree.left.left.name == "entropy"


def test_and_chains_are_one_node():
    tree = parse("entropy > 1 and ratio > 1 and logprob > -1 and position > 2")
    assert isinstance(tree, Logical) and len(tree.operands) == 4 and tree.depth == 4  # and > compare > leaf


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("entropy<0.5", "entropy < 0.5"),
        ("((entropy)) < (0.5)", "entropy < 0.5"),
        ("entropy < 1 / 500", "entropy < 0.002"),  # constants fold in float64
        ("entropy < 1 - 2 - 3", "entropy < -4"),  # (1 - 2) - 3
        ("entropy < 2 / 4 / 2", "entropy < 0.25"),
        ("entropy < -(-3)", "entropy < 3"),
        ("entropy < min(3, 2, 5) + max(1, 4) + abs(-1)", "entropy < 7"),
        ("entropy - (ratio - logprob) > 0", "entropy - (ratio - logprob) > 0"),  # the parentheses matter
        ("(entropy - ratio) - logprob > 0", "entropy - ratio - logprob > 0"),  # these do not
        ("entropy / (ratio * 2) > 1", "entropy / (ratio * 2) > 1"),
        ("-(entropy + 1) < 0", "-(entropy + 1) < 0"),
        ("(entropy > 1 or ratio > 1) and logprob < 0", "(entropy > 1 or ratio > 1) and logprob < 0"),
        ("entropy > 1 or (ratio > 1 and logprob < 0)", "entropy > 1 or ratio > 1 and logprob < 0"),
        ("not (entropy > 1 and ratio > 1)", "not (entropy > 1 and ratio > 1)"),
        ("entropy > 1 and 2 > 1", "entropy > 1"),  # an always-true operand of 'and' drops out
        ("entropy > 1 or 1 > 2", "entropy > 1"),
        ("entropy > 1 and not 1 > 2", "entropy > 1"),
        ("entropy < quantile(entropy, 0.8, 1 < 2)", "entropy < quantile(entropy, 0.8)"),  # 'where' always true
        ("entropy < quantile(entropy, 4 / 5)", "entropy < quantile(entropy, 0.8)"),
    ],
)
def test_canonical_text(text, canonical):
    assert compile_expression(text).canonical == canonical
    assert compile_expression(canonical).canonical == canonical  # the canonical text is a fixed point


def test_constant_or_makes_the_whole_condition_constant():
    with pytest.raises(ValueError, match="always true"):
        compile_expression("entropy > 1 or 2 > 1")
    with pytest.raises(ValueError, match="always false"):
        compile_expression("entropy > 1 and 1 > 2")


def test_reparsing_the_printed_tree_gives_the_same_tree():
    text = "not (abs(advantage) * -2 > max(entropy, 1) or position + 1 >= length / 2) or probability < 0.1"
    tree = parse(text)
    again = parse(to_text(tree))
    assert to_text(again) == to_text(tree)
    assert type(again) is type(tree) and len(again.operands) == len(tree.operands)


def test_quantiles_are_shared_and_named():
    program = compile_expression(
        "entropy < quantile(entropy, 0.8) and entropy > quantile(entropy,0.2) and ratio < quantile(entropy, .8)"
        " and logprob < quantile(logprob, 0.5) and -logprob < quantile(-logprob, 0.5)"
        " and entropy < quantile(entropy, 0.8, advantage > 0)"
    )
    assert [q.text for q in program.quantiles] == [
        "quantile(entropy, 0.8)", "quantile(entropy, 0.2)", "quantile(logprob, 0.5)", "quantile(-logprob, 0.5)",
        "quantile(entropy, 0.8, advantage > 0)",
    ]
    assert [q.q for q in program.quantiles] == [0.8, 0.2, 0.5, 0.5, 0.8]
    # metric names keep letters, digits, '_' and '.'; a collision gets a suffix
    assert [q.metric for q in program.quantiles] == [
        "quantile_entropy_0.8", "quantile_entropy_0.2", "quantile_logprob_0.5", "quantile_logprob_0.5_2",
        "quantile_entropy_0.8_advantage_0",
    ]


@pytest.mark.parametrize(
    ("text", "reads"),
    [
        ("probability < 0.1 and ratio > 1 and advantage > 0 and position < length", set()),
        ("entropy < 1", {"entropy"}),
        ("logprob < quantile(entropy, 0.5)", {"entropy"}),
        ("abs(logprob - rollout_logprob) > 1 or rollout_probability < 0.1", {"rollout_logprobs"}),
        ("logprob - ref_logprob > 1", {"ref_logprobs"}),
    ],
)
def test_programs_declare_the_batch_fields_they_read(text, reads):
    assert compile_expression(text).reads == reads


def test_every_feature_parses_and_has_a_description():
    for name, spec in FEATURES.items():
        assert compile_expression(f"{name} > 0").features <= {name, spec.log_space or name}
        assert spec.description


def test_calls_keep_their_arguments():
    tree = parse("min(entropy, 1, ratio) < 2").left
    assert isinstance(tree, Call) and tree.name == "min" and len(tree.args) == 3
    assert isinstance(tree.args[1], Number) and tree.args[1].value == 1.0
