"""The counterfactual audit's formulas, by hand: the exact p-value, Fisher's combination, the count-matched random
sets, the probability-only set and the silenced tokens' covariance contribution."""

import math

import pytest
import torch

from rlstab.demo.counterfactual_stats import (
    exact_p_value,
    fisher,
    lowest_probability_set,
    random_sets,
    rank,
    sign,
    silenced_covariance,
    upper_p_value,
)


def test_the_one_sided_p_value_counts_null_draws_at_least_as_large():
    # the mask's share 0.5 among 0.1, 0.5, 0.7, 0.2: two at least as large (0.5 ties, 0.7): (1 + 2) / 5
    assert upper_p_value(0.5, [0.1, 0.5, 0.7, 0.2]) == 3 / 5
    # one-sided: far below every draw is p = 1, far above is 1 / (K + 1)
    assert upper_p_value(-1.0, [0.1, 0.2, 0.3]) == 1.0
    assert upper_p_value(9.0, [0.1, 0.2, 0.3]) == 1 / 4


def test_the_exact_p_value_counts_null_draws_at_least_as_far_from_the_median():
    # values 1, 2, 3 and the mask's 10: median (2 + 3) / 2 = 2.5; distances 1.5, 0.5, 0.5 against 7.5: none as far
    assert exact_p_value(10.0, [1.0, 2.0, 3.0]) == 1 / 4
    # the mask at 2 among 1, 3, 5: median of 1, 2, 3, 5 is 2.5; its distance 0.5; 1 (1.5), 3 (0.5), 5 (2.5): all three
    assert exact_p_value(2.0, [1.0, 3.0, 5.0]) == (1 + 3) / 4
    # two-sided: as extreme below as above (median of -10, 0, 1, 2, 3 is 1; distance 11, none as far)
    assert exact_p_value(-10.0, [0.0, 1.0, 2.0, 3.0]) == 1 / 5
    # ties count against the mask: every value equal gives p = 1
    assert exact_p_value(0.5, [0.5] * 9) == 1.0
    # the smallest p with K = 50 null draws is 1/51
    assert exact_p_value(1e9, [float(k) for k in range(50)]) == 1 / 51


def test_the_exact_p_value_is_valid_under_exchangeability():
    # The mask drawn like the null: over many repetitions P(p <= a) <= a for every a (here K = 19, a = 0.05 and 0.2).
    generator = torch.Generator().manual_seed(0)
    ps = []
    for _ in range(2000):
        x = torch.randn(20, generator=generator).tolist()
        ps.append(exact_p_value(x[0], x[1:]))
    for a in (0.05, 0.2):
        assert sum(p <= a for p in ps) / len(ps) <= a + 0.015  # 3 standard errors of a binomial at 2000


def test_the_rank_is_the_mid_rank_from_the_lowest():
    assert rank(10.0, [1.0, 2.0, 3.0]) == 4
    assert rank(-1.0, [1.0, 2.0, 3.0]) == 1
    assert rank(2.0, [1.0, 2.0, 3.0]) == 2.5  # one below, one tie: 1 + 1 + 1/2


def test_fisher_by_hand():
    # one state: X = -2 ln p and p back
    x, p = fisher([0.2])
    assert x == pytest.approx(-2 * math.log(0.2)) and p == pytest.approx(0.2)
    # two states of p = 0.1: X = -4 ln 0.1 = 9.2103; chi2 with 4 df: exp(-X/2)(1 + X/2) = 0.01 (1 + 4.6052) = 0.056052
    x, p = fisher([0.1, 0.1])
    assert x == pytest.approx(9.21034, abs=1e-5) and p == pytest.approx(0.056052, abs=1e-6)
    # three states: exp(-X/2)(1 + X/2 + (X/2)^2 / 2) with X/2 = -ln(0.5 * 0.2 * 0.05) = ln 200 = 5.29832
    h = math.log(200)
    assert fisher([0.5, 0.2, 0.05])[1] == pytest.approx(math.exp(-h) * (1 + h + h * h / 2))
    assert fisher([]) == (None, None)
    assert fisher([1.0, 1.0])[1] == 1.0


def test_random_sets_have_the_count_distinct_positive_tokens_and_vary():
    positive = torch.tensor([[True, False, True, True], [False, True, True, False], [True, True, True, True]])
    candidates = positive.flatten().nonzero()[:, 0]
    sets = random_sets(candidates, 3, 60, torch.Generator().manual_seed(1))
    assert len(sets) == 60
    for s in sets:
        assert s.numel() == 3 and s.unique().numel() == 3  # exactly the count, no token twice
        assert bool(positive.flatten()[s].all())  # only A > 0 tokens
    assert len({tuple(s.tolist()) for s in sets}) > 20  # C(9, 3) = 84 sets possible: the draws spread
    again = random_sets(candidates, 3, 60, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(sets, again))  # a seed fixes the draws
    assert random_sets(candidates, 0, 2, torch.Generator())[0].numel() == 0
    with pytest.raises(ValueError):
        random_sets(candidates, 10, 1, torch.Generator())


def test_the_probability_only_set_is_the_lowest_probabilities_among_the_positive():
    logprobs = torch.tensor([-0.1, -5.0, -3.0, -9.0, -2.0, -7.0])
    candidates = torch.tensor([0, 2, 4, 5])  # token 1 and 3 (the two lowest) have A <= 0
    assert lowest_probability_set(logprobs, candidates, 2).tolist() == [2, 5]  # -7 and -3
    tied = torch.tensor([-1.0, -1.0, -1.0])
    assert lowest_probability_set(tied, torch.tensor([0, 1, 2]), 2).tolist() == [0, 1]  # ties: the earlier


def test_the_silenced_covariance_contribution_by_hand():
    logprobs = torch.tensor([[-1.0, -3.0], [-2.0, 0.0]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    valid = torch.tensor([[True, True], [True, False]])
    # valid: logp -1, -3, -2 (mean -2), A 1, 1, -1 (mean 1/3); products (1)(2/3), (-1)(2/3), (0)(-4/3)
    silenced = torch.tensor([[False, True], [False, False]])
    assert silenced_covariance(logprobs, advantages, valid, silenced) == pytest.approx(-2 / 3 / 3)
    # S = every valid token: c_S is the covariance itself, (2/3 - 2/3 + 0) / 3 = 0
    assert silenced_covariance(logprobs, advantages, valid, valid.clone()) == pytest.approx(0.0, abs=1e-12)
    first_row = torch.tensor([[True, True], [False, False]])  # (2/3 - 2/3) / 3 = 0; the last alone: 0
    assert silenced_covariance(logprobs, advantages, valid, first_row) == pytest.approx(0.0, abs=1e-12)
    first = torch.tensor([[True, False], [False, False]])
    assert silenced_covariance(logprobs, advantages, valid, first) == pytest.approx(2 / 3 / 3)
    assert sign(-0.2) == -1 and sign(0.0) == 0 and sign(3.0) == 1
