"""Each feature, operator and function on a hand-built batch, with the expected masks worked out by hand.

Two responses of up to 3 tokens; row 1's last token is padding (its values are still computed, so
the expected masks show them too).

    p          = [[0.5, 0.1, 0.01], [0.9, 0.2, 0.3]]     log p = [[-0.69, -2.30, -4.61], [-0.11, -1.61, -1.20]]
    p_old      = [[0.25, 0.1, 0.02], [0.9, 0.4, 0.3]]    ratio = p / p_old = [[2, 1, 0.5], [1, 0.5, 1]]
    p_rollout  = [[0.5, 0.2, 0.01], [0.9, 0.2, 0.6]]
    p_ref      = [[0.5, 0.05, 0.01], [0.45, 0.2, 0.3]]
    entropy    = [[0.2, 1.0, 2.0], [0.5, 0.1, 3.0]]
    advantage  = [1, -2] (per response)
    length     = [3, 2],  position = [0, 1, 2]
"""

import math

import pytest
import torch

import rlstab
from rlstab.expression import compile_expression
from rlstab.quantile import quantile
from rlstab.tokens import Tokens

P = torch.tensor([[0.5, 0.1, 0.01], [0.9, 0.2, 0.3]])
P_OLD = torch.tensor([[0.25, 0.1, 0.02], [0.9, 0.4, 0.3]])
P_ROLLOUT = torch.tensor([[0.5, 0.2, 0.01], [0.9, 0.2, 0.6]])
P_REF = torch.tensor([[0.5, 0.05, 0.01], [0.45, 0.2, 0.3]])
H = torch.tensor([[0.2, 1.0, 2.0], [0.5, 0.1, 3.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
A = torch.tensor([1.0, -2.0])


def tokens(advantages=A) -> Tokens:
    batch = rlstab.TokenBatch(
        logprobs=P.log(), old_logprobs=P_OLD.log(), rollout_logprobs=P_ROLLOUT.log(), ref_logprobs=P_REF.log(),
        entropy=H, response_mask=MASK, advantages=advantages,
    )
    t = Tokens.from_batch(batch, log_ratio_clamp=20.0)
    t.set_advantages(batch.advantages)
    return t


def holds(text: str, t: Tokens | None = None) -> list[list[int]]:
    """The condition on every position, quantiles taken over the batch's valid tokens."""
    t = t or tokens()
    program = compile_expression(text)
    thresholds = tuple(quantile(v, q, include) for v, include, q in program.quantile_requests(t))
    out = program.evaluate(t, thresholds)
    assert out.dtype == torch.float32 and out.shape == (2, 3)
    return out.int().tolist()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # p > 0.25: 0.5 yes, 0.1 no, 0.01 no | 0.9 yes, 0.2 no, 0.3 yes
        ("probability > 0.25", [[1, 0, 0], [1, 0, 1]]),
        # log p < -1: -0.69 no, -2.30, -4.61 yes | -0.11 no, -1.61 yes, -1.20 yes
        ("logprob < -1", [[0, 1, 1], [0, 1, 1]]),
        # -log p > 2: 0.69 no, 2.30 yes, 4.61 yes | 0.11, 1.61, 1.20 no
        ("surprisal > 2", [[0, 1, 1], [0, 0, 0]]),
        ("entropy >= 1", [[0, 1, 1], [0, 0, 1]]),
        ("advantage < 0", [[0, 0, 0], [1, 1, 1]]),
        ("ratio > 1.5", [[1, 0, 0], [0, 0, 0]]),  # ratios 2 1 0.5 | 1 0.5 1
        ("ratio < 0.75", [[0, 0, 1], [0, 1, 0]]),
        ("old_probability < 0.05", [[0, 0, 1], [0, 0, 0]]),  # 0.25 0.1 0.02 | 0.9 0.4 0.3
        # log p_old: -1.39 -2.30 -3.91 | -0.11 -0.92 -1.20
        ("old_logprob > -1", [[0, 0, 0], [1, 1, 0]]),
        # rollout p differs by a factor 2 at (0, 1) (0.1 vs 0.2) and (1, 2) (0.3 vs 0.6): |log 2| = 0.69
        ("abs(logprob - rollout_logprob) > 0.5", [[0, 1, 0], [0, 0, 1]]),
        ("rollout_probability > 0.55", [[0, 0, 0], [1, 0, 1]]),  # 0.5 0.2 0.01 | 0.9 0.2 0.6
        # log(p / p_ref): 0, log 2, 0 | log 2, 0, 0
        ("logprob - ref_logprob > 0.5", [[0, 1, 0], [1, 0, 0]]),
        ("position >= 1", [[0, 1, 1], [0, 1, 1]]),
        ("length == 3", [[1, 1, 1], [0, 0, 0]]),
        ("position == length - 1", [[0, 0, 1], [0, 1, 0]]),  # each response's last valid token
    ],
)
def test_features(text, expected):
    assert holds(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("abs(advantage) > 1.5", [[0, 0, 0], [1, 1, 1]]),  # |1| no, |-2| yes
        ("exp(logprob) > 0.25", [[1, 0, 0], [1, 0, 1]]),  # = probability > 0.25
        ("log(entropy) < 0", [[1, 0, 0], [1, 1, 0]]),  # = entropy < 1
        # min(H, r): min(.2, 2)=.2 min(1, 1)=1 min(2, .5)=.5 | min(.5, 1)=.5 min(.1, .5)=.1 min(3, 1)=1
        ("min(entropy, ratio) > 0.4", [[0, 1, 1], [1, 0, 1]]),
        # max(H, r, 1.5): 2, 1.5, 2 | 1.5, 1.5, 3
        ("max(entropy, ratio, 1.5) <= 1.5", [[0, 1, 0], [1, 1, 0]]),
        ("min(1.5, entropy) == 1.5", [[0, 0, 1], [0, 0, 1]]),  # a constant first: min(1.5, 2) = 1.5
        ("entropy * 2 - 1 > 0.5", [[0, 1, 1], [0, 0, 1]]),  # H > 0.75
        # H / r: .1, 1, 4 | .5, .2, 3; 1 > 1 is false
        ("entropy / ratio > 1", [[0, 0, 1], [0, 0, 1]]),
        ("2 / entropy < 1.5", [[0, 0, 1], [0, 0, 1]]),  # 10, 2, 1 | 4, 20, 0.67
        ("-entropy < -1.5", [[0, 0, 1], [0, 0, 1]]),  # H > 1.5
        ("1 - entropy > 0.6", [[1, 0, 0], [0, 1, 0]]),  # H < 0.4
        # or: H < .3 at (0, 0), (1, 1); r > 1.5 at (0, 0)
        ("entropy < 0.3 or ratio > 1.5", [[1, 0, 0], [0, 1, 0]]),
        ("not entropy < 0.3", [[0, 1, 1], [1, 0, 1]]),
        # not binds looser than <, tighter than and: (not H < .3) and A > 0
        ("not entropy < 0.3 and advantage > 0", [[0, 1, 1], [0, 0, 0]]),
        # and binds tighter than or: A < 0 or (H > 1.5 and r < 1)
        ("advantage < 0 or entropy > 1.5 and ratio < 1", [[0, 0, 1], [1, 1, 1]]),
        ("(advantage < 0 or entropy > 1.5) and ratio < 1", [[0, 0, 1], [0, 1, 0]]),
        ("entropy != 1 and entropy == entropy", [[1, 0, 1], [1, 1, 1]]),
        ("0.3 > entropy", [[1, 0, 0], [0, 1, 0]]),  # a constant on the left is mirrored: H < 0.3
    ],
)
def test_operators_and_functions(text, expected):
    assert holds(text) == expected


def test_nan_compares_false_and_division_by_zero_is_inf():
    # log(A): log 1 = 0 on row 0, log(-2) = nan on row 1: every comparison with nan is false.
    assert holds("log(advantage) < 100") == [[1, 1, 1], [0, 0, 0]]
    assert holds("log(advantage) >= 100") == [[0, 0, 0], [0, 0, 0]]
    assert holds("not log(advantage) < 100") == [[0, 0, 0], [1, 1, 1]]
    # H / (position - 1): .2 / -1 < 0; 1 / 0 = inf > 0; 2 / 1 > 0 | .5 / -1; .1 / 0 = inf; 3 / 1
    assert holds("entropy / (position - 1) > 0") == [[0, 1, 1], [0, 1, 1]]


def test_not_equal_with_nan_is_false_too():
    """``!=`` obeys the rule as every comparison: ``x != c`` is ``x < c or x > c`` (IEEE would say nan != c)."""
    # log(A) = 0 on row 0, nan on row 1
    assert holds("log(advantage) != 5") == [[1, 1, 1], [0, 0, 0]]
    assert holds("5 != log(advantage)") == [[1, 1, 1], [0, 0, 0]]  # mirrored: the same
    assert holds("log(advantage) != 0") == [[0, 0, 0], [0, 0, 0]]
    assert holds("log(advantage) == 0") == [[1, 1, 1], [0, 0, 0]]
    # not (x == c) is what selects the nan
    assert holds("not log(advantage) == 5") == [[1, 1, 1], [1, 1, 1]]
    # nan on both sides: log(-A) is nan on row 0, log(A) on row 1: never different, never equal
    assert holds("log(advantage) != log(-advantage)") == [[0, 0, 0], [0, 0, 0]]
    assert holds("log(advantage) == log(-advantage)") == [[0, 0, 0], [0, 0, 0]]
    # a per-response nan against per-token values (broadcast [2, 1] against [2, 3]): entropy 0.2 1 2 | 0.5 0.1 3
    assert holds("log(advantage) != entropy") == [[1, 1, 1], [0, 0, 0]]
    assert holds("entropy != 1") == [[1, 0, 1], [1, 1, 1]]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # valid entropies sorted: .1 .2 .5 1 2 (n = 5). Median: position 0.5 * 4 = 2 -> 0.5.
        ("entropy >= quantile(entropy, 0.5)", [[0, 1, 1], [1, 0, 1]]),
        # Q_0.8: position 3.2 -> 1 + 0.2 * (2 - 1) = 1.2
        ("entropy > quantile(entropy, 0.8)", [[0, 0, 1], [0, 0, 1]]),
        # population of the A > 0 row only: .2 1 2 -> median 1
        ("entropy < quantile(entropy, 0.5, advantage > 0)", [[1, 0, 0], [1, 1, 0]]),
        # per-response features count once per token: lengths 3 3 3 2 2 -> sorted 2 2 3 3 3, median 3
        ("length < quantile(length, 0.5)", [[0, 0, 0], [1, 1, 1]]),
        # the quantile of an expression: H * r = .4 1 1 | .5 .05 (valid) -> sorted .05 .4 .5 1 1, median .5
        ("entropy * ratio > quantile(entropy * ratio, 0.5)", [[0, 1, 1], [0, 0, 1]]),
        # q = 0 and q = 1 are the minimum and the maximum: .1 and 2
        ("entropy <= quantile(entropy, 0) or entropy >= quantile(entropy, 1)", [[0, 0, 1], [0, 1, 1]]),
        # arithmetic on a quantile: half the median 0.5 -> 0.25
        ("entropy < quantile(entropy, 0.5) / 2", [[1, 0, 0], [0, 1, 0]]),
    ],
)
def test_quantiles(text, expected):
    assert holds(text) == expected


def test_quantile_population_drops_nan_values():
    # log(A) is 0 on row 0 (3 valid tokens) and nan on row 1: the population is 0 0 0.
    program = compile_expression("entropy > quantile(log(advantage), 0.5)")
    ((values, include, q),) = program.quantile_requests(tokens())
    assert include.tolist() == [[True, True, True], [False, False, False]]
    assert q == 0.5


def test_a_probability_compared_with_a_constant_is_compared_in_log_space():
    # Near the threshold, exp(log p) in float32 and p < c can disagree with log p < log c: S2T compares
    # log p < log(tau_p), and so must the expression. Take the float32 neighbours of log(0.002).
    bound = torch.tensor(math.log(0.002), dtype=torch.float32)
    neighbours = [bound]
    for _ in range(40):
        neighbours.insert(0, torch.nextafter(neighbours[0], torch.tensor(-math.inf)))
        neighbours.append(torch.nextafter(neighbours[-1], torch.tensor(math.inf)))
    logprobs = torch.stack(neighbours).reshape(1, -1)
    batch = rlstab.TokenBatch(logprobs=logprobs, response_mask=torch.ones_like(logprobs, dtype=torch.bool),
                              advantages=torch.ones(1))
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(batch.advantages)
    program = compile_expression("probability < 0.002")
    expected = (logprobs < math.log(0.002)).float()
    assert torch.equal(program.evaluate(t), expected)
    assert int(expected.sum()) == 40  # the 40 neighbours below the bound
    assert not torch.equal((logprobs.exp() < 0.002).float(), expected)  # so the test can tell the two apart
    # the same on the other side, and with the constant on the left
    assert torch.equal(compile_expression("probability >= 0.002").evaluate(t), 1 - expected)
    assert torch.equal(compile_expression("0.002 > probability").evaluate(t), expected)


def test_per_response_conditions_are_broadcast_to_every_token():
    out = compile_expression("advantage > 0").evaluate(tokens())
    assert out.shape == (2, 3) and out.is_contiguous()
    assert out.tolist() == [[1, 1, 1], [0, 0, 0]]


def test_per_token_advantages():
    per_token = torch.tensor([[1.0, -1.0, 2.0], [0.0, 3.0, -5.0]])
    assert holds("advantage > 0.5", tokens(per_token)) == [[1, 0, 1], [0, 1, 0]]


def test_evaluate_wants_one_value_per_quantile():
    program = compile_expression("entropy < quantile(entropy, 0.5) and ratio > quantile(ratio, 0.5)")
    with pytest.raises(ValueError, match="needs 2 quantile values, got 1"):
        program.evaluate(tokens(), (torch.tensor(1.0),))


def test_in_place_logic_never_touches_the_features():
    t = tokens()
    before = {name: getattr(t, name).clone() for name in ("logprobs", "old_logprobs", "entropy", "ratio", "valid")}
    program = compile_expression("not (entropy < 1 or ratio > 1.5) and advantage > 0 or not position < 1")
    first = program.evaluate(t).clone()
    # (not (H < 1 or r > 1.5) and A > 0) or position >= 1: row 0 t0 (H .2) no, t1 t2 yes | row 1 t1 t2 yes
    assert first.int().tolist() == [[0, 1, 1], [0, 1, 1]]
    assert torch.equal(program.evaluate(t), first)
    for name, value in before.items():
        assert torch.equal(getattr(t, name), value), name
