"""The exact power of the two-sided paired t-test and its minimum detectable effect (rlstab.lab.power): closed forms,
independent quadratures, the normal limit, the issue's numbers and a seeded simulation of the test itself."""

import math
import random
from statistics import NormalDist

import pytest

from rlstab.lab.power import mde_factor, t_test_power
from rlstab.lab.tdist import t_quantile

from exact_power import exact_mde


def _approximation(n: int, alpha: float) -> float:
    """The normal-approximation factor the lab used before: (t_{1-alpha/2, n-1} + t_{0.80, n-1}) / sqrt(n)."""
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(0.8, n - 1)) / math.sqrt(n)


@pytest.mark.parametrize(("alpha", "expected"), [
    # df 2 (n = 3): S^2 = V / 2 with V ~ chi2(2) is Exp(1), so P(S < x) = 1 - exp(-x^2), and the expectation over Z of
    # exp(-(Z + lambda)^2 / c^2) on Z > -lambda is Gaussian: power = 1 - c / sqrt(c^2 + 2) exp(-lambda^2 / (c^2 + 2)).
    # With t_q = (2q - 1) / sqrt(2q(1 - q)) at df 2, c^2 + 2 = 2 / (alpha (2 - alpha)) and c / sqrt(c^2 + 2) = 1 - alpha,
    # so power 0.8 at lambda^2 = 2 / (alpha (2 - alpha)) x ln((1 - alpha) / 0.2), d = lambda / sqrt(3):
    # alpha 0.05: 20.51282 x ln(4.75) = 20.51282 x 1.5581446 = 31.961941; sqrt(31.961941 / 3) = 3.2640435
    (0.05, 3.2640435),
    # alpha 0.025 (m = 2): 40.50633 x ln(4.875) = 40.50633 x 1.5841201 = 64.16689; sqrt(64.16689 / 3) = 4.6248204
    (0.025, 4.6248204),
    # alpha 0.05 / 18: 360.50070 x ln(4.986111) = 360.50070 x 1.6066563 = 579.20070; sqrt(579.20070 / 3) = 13.8948516
    (0.05 / 18, 13.8948516),
])
def test_the_closed_form_at_three_pairs(alpha, expected):
    assert mde_factor(3, alpha) == pytest.approx(expected, abs=1e-7)
    c = t_quantile(1 - alpha / 2, 2)
    for d in (0.5, 1.0, 3.0, 10.0):
        lam2 = 3 * d * d
        assert t_test_power(d, 3, alpha) == pytest.approx(1 - c / math.sqrt(c * c + 2) * math.exp(-lam2 / (c * c + 2)),
                                                          abs=1e-11)


def _power_at_one_degree_of_freedom(lam: float, c: float, steps: int = 2000) -> float:
    """df 1 (n = 2): T' = (Z + lambda) / |W|, so the test rejects when the point (Z + lambda, W), a normal of mean
    (lambda, 0), lies in the double wedge |x| > c |w|: angles within atan(1 / c) of 0 or pi. The angle of that normal
    has density (e^{-lambda^2/2} + sqrt(2 pi) u Phi(u) e^{-lambda^2 sin^2(t) / 2}) / (2 pi), u = lambda cos t (the
    projected normal); Simpson's rule over the two wedges. Independent of the integral over S."""
    wedge = math.atan(1 / c)

    def density(t):
        u = lam * math.cos(t)
        phi_u = 0.5 * math.erfc(-u / math.sqrt(2))
        return (math.exp(-lam * lam / 2) + math.sqrt(2 * math.pi) * u * phi_u * math.exp(-(lam * math.sin(t)) ** 2 / 2)) / (2 * math.pi)

    def simpson(a, b):
        h = (b - a) / steps
        return h / 3 * sum((1 if i in (0, steps) else 4 if i % 2 else 2) * density(a + i * h) for i in range(steps + 1))

    return simpson(-wedge, wedge) + simpson(math.pi - wedge, math.pi + wedge)


@pytest.mark.parametrize("m", [1, 20])
def test_two_pairs_one_degree_of_freedom(m):
    alpha = 0.05 / m
    c = t_quantile(1 - alpha / 2, 1)  # tan(pi (1 - alpha) / 2): 12.706 at m = 1, 254.6 at m = 20
    d = mde_factor(2, alpha)
    assert _power_at_one_degree_of_freedom(d * math.sqrt(2), c) == pytest.approx(0.8, abs=1e-9)
    assert _power_at_one_degree_of_freedom(0.0, c) == pytest.approx(alpha, abs=1e-9)
    for effect in (1.0, 5.0, 20.0):
        assert t_test_power(effect, 2, alpha) == pytest.approx(_power_at_one_degree_of_freedom(effect * math.sqrt(2), c),
                                                               abs=1e-9)
    # 11.55 x sd at two pairs and alpha 0.05 (the normal approximation says 9.96)
    assert (round(mde_factor(2), 2), round(_approximation(2, 0.05), 2)) == (11.55, 9.96)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 30])
@pytest.mark.parametrize("alpha", [0.05, 0.05 / 20])
def test_no_effect_has_the_tests_size(n, alpha):
    # d = 0: the central t, whose two-sided tail at t_{1-alpha/2} is alpha (tdist's incomplete beta, not this integral)
    assert t_test_power(0.0, n, alpha) == pytest.approx(alpha, abs=1e-11)


def test_the_issues_numbers():
    # One true effect among m = 18 comparisons at n = 8: 1.9951 sd (the issue's "about 2.0"), against 1.1560 sd at alpha
    # 0.05 alone: 1.9951 / 1.1560 = 1.7258, the issue's x1.73
    holm8, raw8 = mde_factor(8, 0.05 / 18), mde_factor(8, 0.05)
    assert 1.99 <= holm8 <= 2.0 and holm8 == pytest.approx(1.9951, abs=1e-4) and raw8 == pytest.approx(1.1560, abs=1e-4)
    assert holm8 / raw8 == pytest.approx(1.73, abs=0.005)
    # n = 5, m = 20: 3.7759 / 1.6820 = 2.2449, the issue's x2.24
    holm5, raw5 = mde_factor(5, 0.05 / 20), mde_factor(5, 0.05)
    assert holm5 == pytest.approx(3.7759, abs=1e-4) and raw5 == pytest.approx(1.6820, abs=1e-4)
    assert holm5 / raw5 == pytest.approx(2.24, abs=0.005)
    # The normal approximation understates both: (4.5062 + 0.8960) / sqrt(8) = 1.9100, 4% below 1.9951;
    # (6.7583 + 0.9410) / sqrt(5) = 3.4432, 9% below 3.7759
    assert _approximation(8, 0.05 / 18) == pytest.approx(1.9100, abs=1e-4)
    assert 1 - _approximation(8, 0.05 / 18) / holm8 == pytest.approx(0.043, abs=1e-3)
    assert 1 - _approximation(5, 0.05 / 20) / holm5 == pytest.approx(0.088, abs=1e-3)


@pytest.mark.parametrize(("n", "m", "steps"), [(8, 18, 1500), (8, 1, 1500), (6, 4, 1500), (10, 3, 1500), (12, 32, 1500),
                                               (20, 12, 1500), (5, 20, 6000)])
def test_the_independent_quadrature(n, m, steps):
    # tests/exact_power.py: the midpoint rule over V ~ chi2(n - 1) and 16 bisections on [0, 6] (a resolution of 1e-4);
    # at 5 pairs and alpha 0.05 / 20 its default 1500 steps are too coarse for the steep integrand, hence 6000
    assert mde_factor(n, 0.05 / m) == pytest.approx(exact_mde(n, 0.05 / m, steps), abs=2e-4)


@pytest.mark.parametrize("m", [1, 18])
def test_many_pairs_tend_to_the_normal_formula(m):
    # n large: T' -> normal(lambda, 1), so d sqrt(n) -> the lambda with Phi(lambda - z) + Phi(-lambda - z) = 0.8,
    # z = z_{1 - alpha/(2m)}: z + z_{0.80} but for the other tail, Phi(-lambda - z) (9.6e-7 at m = 1), that is
    # 1.959964 + 0.841621 = 2.801585 at m = 1 and 2.991316 + 0.841621 = 3.832937 at m = 18, less 3e-6 and 2e-11.
    # The t's heavier tails put the exact factor above the limit, by O(1/n): about 0.95 / n at m = 1, 2.2 / n at m = 18.
    normal = NormalDist()
    z = normal.inv_cdf(1 - 0.05 / (2 * m))
    limit = z + normal.inv_cdf(0.8)
    for _ in range(3):  # Newton on the two-tailed normal power, from z + z_{0.80}
        limit -= (normal.cdf(limit - z) + normal.cdf(-limit - z) - 0.8) / (normal.pdf(limit - z) - normal.pdf(-limit - z))
    assert limit == pytest.approx(z + normal.inv_cdf(0.8), abs=5e-6)
    excess = [mde_factor(n, 0.05 / m) * math.sqrt(n) / limit - 1 for n in (1_000, 10_000, 100_000)]
    assert all(0 < e < 3 / n for e, n in zip(excess, (1_000, 10_000, 100_000)))
    assert excess[2] < 3e-5 and excess[1] / excess[2] == pytest.approx(10, rel=0.05)


def test_a_seeded_simulation_of_the_test():
    # 20,000 draws of 5 normal differences with mean d = mde_factor(5, 0.05 / 20) and sd 1, each t-tested at two-sided
    # 0.05 / 20: the share rejected is 0.8 within 4 standard errors (sqrt(0.8 x 0.2 / 20000) = 0.0028)
    n, alpha = 5, 0.05 / 20
    d, c, rng = mde_factor(n, alpha), t_quantile(1 - alpha / 2, n - 1), random.Random(39)
    rejected = 0
    for _ in range(20_000):
        xs = [rng.gauss(d, 1.0) for _ in range(n)]
        mean = sum(xs) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        rejected += abs(mean / (sd / math.sqrt(n))) > c
    assert rejected / 20_000 == pytest.approx(0.8, abs=4 * 0.0028)


def test_the_exact_factor_is_above_the_approximation_and_falls_with_n():
    for alpha in (0.05, 0.05 / 18):
        factors = [mde_factor(n, alpha) for n in range(2, 13)]
        assert all(f > _approximation(n, alpha) for n, f in zip(range(2, 13), factors))
        assert all(a > b for a, b in zip(factors, factors[1:]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least 2 pairs"):
        mde_factor(1)
    with pytest.raises(ValueError, match="alpha = 0"):
        t_test_power(1.0, 5, 0.0)
    with pytest.raises(ValueError, match="power = 0.01"):
        mde_factor(5, 0.05, 0.01)
    assert t_test_power(-1.0, 5) == t_test_power(1.0, 5)  # two-sided: the sign does not matter
