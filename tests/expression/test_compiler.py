"""``rlstab.expression.compiler``: a checked tree compiled to torch operations, and the step quantiles it needs.

The tokens: one response of four tokens, entropies 0.1, 0.5, nan, 2.0 and log-probs log(0.001), log(0.002),
log(0.5), log(1); conditions come out as float32 0/1.
"""

import math

import pytest
import torch

from rlstab.batch import TokenBatch
from rlstab.expression import parse
from rlstab.expression.checker import check
from rlstab.expression.compiler import Compiler, Environment, QuantileSpec
from rlstab.tokens import Tokens

LOGPROBS = [math.log(0.001), math.log(0.002), math.log(0.5), 0.0]


def tokens():
    batch = TokenBatch(logprobs=torch.tensor([LOGPROBS]), response_mask=torch.ones(1, 4, dtype=torch.bool),
                       advantages=torch.tensor([1.0]), entropy=torch.tensor([[0.1, 0.5, math.nan, 2.0]]))
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(batch.advantages)
    return t


def compiled(text):
    compiler = Compiler()
    return compiler.compile(check(parse(text), text)), compiler


def run(text, thresholds=()):
    fn, _ = compiled(text)
    return fn(Environment(tokens(), thresholds))


@pytest.mark.parametrize("text, expected", [
    ("entropy < 1", [1.0, 1.0, 0.0, 0.0]),  # nan < 1 is false
    ("entropy >= 0.5 and entropy < 3", [0.0, 1.0, 0.0, 1.0]),  # and: the product
    ("entropy < 0.2 or entropy > 1", [1.0, 0.0, 0.0, 1.0]),  # or: the maximum
    ("not entropy < 1", [0.0, 0.0, 1.0, 1.0]),  # not: 1 - x, so nan's false becomes true
    ("entropy != 0.5", [1.0, 0.0, 0.0, 1.0]),  # != is < or >: false for nan, unlike IEEE
    ("entropy * 2 - 0.2 > 0.7", [0.0, 1.0, 0.0, 1.0]),  # 0.0, 0.8, nan, 3.8
    ("max(entropy, 1) == 1", [1.0, 1.0, 0.0, 0.0]),  # clamp(min=1): 1, 1, nan, 2
])
def test_conditions_are_float32_zero_one(text, expected):
    out = run(text)
    assert out.dtype == torch.float32 and out.flatten().tolist() == expected


def test_a_probability_against_a_positive_constant_is_compared_in_log_space():
    # probability < 0.002 becomes logprob < log(0.002): token 1 (logprob exactly log(0.002)) is not below it,
    # whatever exp(log(0.002)) rounds to in float32.
    assert run("probability < 0.002").flatten().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert run("0.002 > probability").flatten().tolist() == [1.0, 0.0, 0.0, 0.0]  # the constant on the left


def test_quantiles_become_step_thresholds_shared_by_their_text():
    fn, compiler = compiled("entropy > quantile(entropy, 0.8) or entropy < quantile(entropy, 0.8) / 10")
    (spec,) = compiler.quantiles  # written twice, gathered once
    assert isinstance(spec, QuantileSpec) and (spec.text, spec.metric, spec.q, spec.where) == (
        "quantile(entropy, 0.8)", "quantile_entropy_0.8", 0.8, None)
    assert compiler.features == {"entropy"}
    # threshold 0.4: entropy > 0.4 (0.5, 2.0) or entropy < 0.04 (none)
    assert fn(Environment(tokens(), (torch.tensor(0.4),))).flatten().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_quantiles_with_a_population_are_named_apart():
    _, compiler = compiled("entropy > quantile(entropy, 0.5) and entropy > quantile(entropy, 0.5, ratio > 1)")
    assert [s.metric for s in compiler.quantiles] == ["quantile_entropy_0.5", "quantile_entropy_0.5_ratio_1"]
    assert compiler.quantiles[1].where is not None
    # "ratio > 1" and "ratio < 1" clean up to the same name: the second takes a suffix
    _, compiler = compiled("entropy > quantile(entropy, 0.5, ratio > 1) and entropy > quantile(entropy, 0.5, ratio < 1)")
    assert [s.metric for s in compiler.quantiles] == ["quantile_entropy_0.5_ratio_1", "quantile_entropy_0.5_ratio_1_2"]


def test_the_environment_computes_each_feature_once():
    env = Environment(tokens())
    assert env.feature("entropy") is env.feature("entropy")
