import math

import pytest

from rlstab.lab.statistics import mean_interval, paired_difference, t975


def test_t_quantiles_match_the_table_and_the_expansion():
    assert t975(1) == 12.7062
    assert t975(4) == 2.7764  # 5 seeds
    # Beyond the table, the expansion: published values 2.0211 (40), 2.0003 (60), 1.9799 (120).
    assert t975(40) == pytest.approx(2.0211, abs=2e-4)
    assert t975(60) == pytest.approx(2.0003, abs=1e-4)
    assert t975(120) == pytest.approx(1.9799, abs=1e-4)
    # It joins the table smoothly: at 31, between 30's 2.0423 and 40's 2.0211 (published 2.0395).
    assert t975(31) == pytest.approx(2.0395, abs=2e-4)
    with pytest.raises(ValueError):
        t975(0)


def test_mean_interval_by_hand():
    # values 1, 2, 3, 4, 5: mean 3, sample sd sqrt(10/4) = 1.5811, se = 1.5811 / sqrt(5) = 0.70711,
    # half width 2.7764 * 0.707107 = 1.963211
    stat = mean_interval([1, 2, 3, 4, 5])
    assert stat["mean"] == 3.0 and stat["n"] == 5
    assert stat["low"] == pytest.approx(3 - 1.963211, abs=1e-6)
    assert stat["high"] == pytest.approx(3 + 1.963211, abs=1e-6)


def test_mean_interval_edges():
    assert mean_interval([]) == {"mean": None, "low": None, "high": None, "n": 0}
    assert mean_interval([None, 0.5]) == {"mean": 0.5, "low": None, "high": None, "n": 1}
    same = mean_interval([0.25, 0.25, 0.25])
    assert same["low"] == same["high"] == 0.25
    assert math.isnan(mean_interval([1.0, float("nan")])["mean"])  # NaN is kept, never hidden


def test_paired_difference_by_hand():
    # diffs by seed: 0.1, 0.2, 0.0, 0.1 -> mean 0.1, sd sqrt((0 + .01 + .01 + 0) / 3) = 0.08165,
    # se 0.040825, half width 3.1824 * 0.040825 = 0.12992: interval [-0.0299, 0.2299] contains 0
    values = {0: 0.6, 1: 0.7, 2: 0.5, 3: 0.6, 9: 0.9}
    base = {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}  # seed 9 has no baseline run: left out
    d = paired_difference(values, base)
    assert d["n"] == 4 and d["mean"] == pytest.approx(0.1)
    assert d["low"] == pytest.approx(0.1 - 0.12992, abs=1e-5)
    assert (d["wins"], d["ties"], d["losses"]) == (3, 1, 0)
    assert d["distinguishable"] is False


def test_paired_difference_distinguishable_and_undecided():
    d = paired_difference({0: 0.6, 1: 0.61, 2: 0.62}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert d["distinguishable"] is True and d["low"] > 0
    assert paired_difference({0: 0.6}, {0: 0.5})["distinguishable"] is None
    assert paired_difference({0: 0.4, 1: 0.3}, {0: 0.5, 1: 0.5})["losses"] == 2


# --- p-values, Holm, the minimum detectable effect ------------------------------------------------

from rlstab.lab.power import mde_factor  # noqa: E402
from rlstab.lab.statistics import adjust, holm, minimum_detectable_effect, paired_p, seeds_for  # noqa: E402
from rlstab.lab.tdist import incomplete_beta, t_cdf, t_quantile, t_two_sided_p  # noqa: E402

from exact_power import exact_mde as _exact_mde  # noqa: E402


@pytest.mark.parametrize(("q", "df", "table"), [
    # Student's t table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), one-sided upper quantiles
    (0.975, 4, 2.776), (0.8, 4, 0.941), (0.975, 1, 12.706), (0.8, 1, 1.376), (0.8, 9, 0.883),
    (0.95, 10, 1.812), (0.99, 5, 3.365), (0.975, 30, 2.042), (0.9, 2, 1.886),
])
def test_t_quantiles_match_the_table(q, df, table):
    assert t_quantile(q, df) == pytest.approx(table, abs=6e-4)
    assert t_quantile(1 - q, df) == pytest.approx(-table, abs=6e-4)  # symmetric


def test_t_quantile_agrees_with_the_lab_table():
    for df in range(1, 31):
        assert t_quantile(0.975, df) == pytest.approx(t975(df), abs=6e-5)  # the table is to 4 decimals


def test_t_distribution_by_hand():
    # df 1 is the Cauchy: P(T <= 1) = 1/2 + atan(1)/pi = 0.75, so the two-sided p of t = 1 is 0.5.
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)
    # df 2: P(T <= t) = 1/2 + t / (2 sqrt(2 + t^2)); t = 2: 1/2 + 2 / (2 sqrt 6) = 0.908248
    assert t_cdf(2.0, 2) == pytest.approx(0.5 + 1 / math.sqrt(6), abs=1e-12)
    assert t_cdf(0.0, 7) == 0.5 and t_two_sided_p(0.0, 7) == 1.0
    assert t_two_sided_p(2.776445, 4) == pytest.approx(0.05, abs=1e-6)  # the 0.975 quantile's p
    assert t_two_sided_p(float("inf"), 4) == 0.0


def test_incomplete_beta_by_hand():
    # I_x(1, 1) = x; I_x(2, 1) = x^2; I_x(1, 2) = 1 - (1 - x)^2 = 0.64 at x = 0.4; I_0.5(a, a) = 1/2
    assert incomplete_beta(0.3, 1, 1) == pytest.approx(0.3, abs=1e-12)
    assert incomplete_beta(0.3, 2, 1) == pytest.approx(0.09, abs=1e-12)
    assert incomplete_beta(0.4, 1, 2) == pytest.approx(0.64, abs=1e-12)
    assert incomplete_beta(0.5, 3.5, 3.5) == pytest.approx(0.5, abs=1e-12)
    assert incomplete_beta(0.9, 2, 0.5) == pytest.approx(1 - incomplete_beta(0.1, 0.5, 2), abs=1e-12)  # the symmetry
    with pytest.raises(ValueError):
        incomplete_beta(1.5, 1, 1)
    with pytest.raises(ValueError):
        t_quantile(1.0, 4)


def test_holm_by_hand():
    # p = 0.01, 0.04, 0.03, 0.005; m = 4. Sorted: 0.005, 0.01, 0.03, 0.04, times m - j + 1 = 4, 3, 2, 1:
    # 0.02, 0.03, 0.06, 0.04; running maximum: 0.02, 0.03, 0.06, 0.06. Back in input order:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1: 0.3 x 3 = 0.9, 0.5 x 2 = 1.0, 0.6 x 1 = 0.6 -> running max 0.9, 1.0, 1.0
    assert holm([0.6, 0.3, 0.5]) == pytest.approx([1.0, 0.9, 1.0])
    # None is no test: m = 2 here, 0.02 x 2 = 0.04, 0.04 x 1 = 0.04
    assert holm([None, 0.04, 0.02]) == [None, pytest.approx(0.04), pytest.approx(0.04)]
    assert holm([0.03]) == [0.03] and holm([]) == []


def test_adjust_makes_holm_the_reading():
    a, b = {"p": 0.01}, {"p": 0.04}
    adjust([a, b, {"p": None}])
    # m = 2: 0.01 x 2 = 0.02 (below 0.05), then max(0.02, 0.04 x 1) = 0.04 (below 0.05)
    # no sd or effective n given: no MDE; the family's name and its m (the comparisons with a p) are recorded
    assert a == {"p": 0.01, "p_holm": pytest.approx(0.02), "distinguishable": True, "family": "all", "m": 2, "mde": None}
    assert b["p_holm"] == pytest.approx(0.04) and b["distinguishable"] is True
    c, d = {"p": 0.02}, {"p": 0.03}
    adjust([c, d, {"p": 0.2}])
    # m = 3: 0.02 x 3 = 0.06, 0.03 x 2 = 0.06, 0.2: both above 0.05, so neither is distinguishable
    assert c["p_holm"] == pytest.approx(0.06) and not c["distinguishable"] and not d["distinguishable"]


def test_paired_p_and_mde_by_hand():
    # The by-hand pairs above: diffs 0.1, 0.2, 0.0, 0.1: mean 0.1, sd 0.08165, t = 0.1 / 0.040825 = sqrt(6),
    # df 3. Closed form for df 3: P(T <= t) = 1/2 + (u / (1 + u^2) + atan(u)) / pi with u = t / sqrt(3) = sqrt(2):
    # 1/2 + (0.471405 + 0.955317) / pi = 0.954140, so p = 2 x (1 - 0.954140) = 0.091721.
    d = paired_difference({0: 0.6, 1: 0.7, 2: 0.5, 3: 0.6}, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5})
    assert d["sd"] == pytest.approx(0.0816497, abs=1e-6)
    assert d["p"] == pytest.approx(0.091721, abs=1e-5) and d["p_holm"] == d["p"]
    # MDE at n = 4: the exact factor 2.1279 (the independent quadrature of tests/exact_power.py, at 6000 steps, gives
    # 2.1275, within its resolution) x sd = 2.1279 x 0.0816497 = 0.17374; the normal approximation,
    # (t(0.975, 3) + t(0.80, 3)) / 2 = (3.1824 + 0.9785) / 2 = 2.0805, gave 0.16987
    assert mde_factor(4) == pytest.approx(_exact_mde(4, 0.05, 6000), abs=1e-3)
    assert d["mde"] == pytest.approx(2.1279 * 0.0816497, abs=1e-4) and d["mde"] == mde_factor(4) * d["sd"]
    assert paired_p(0.0, 0.0, 5) == 1.0 and paired_p(0.1, 0.0, 5) == 0.0 and paired_p(0.1, 0.2, 1) is None
    assert minimum_detectable_effect(None, 5) is None and minimum_detectable_effect(0.1, 1) is None


def test_the_mde_factor_at_five_and_ten_seeds_is_the_exact_one():
    # n = 5: 1.6820 by the exact power (the independent quadrature, at 6000 steps, agrees to 1e-4); the normal
    # approximation, (t(0.975, 4) + t(0.80, 4)) / sqrt(5) = (2.7764 + 0.9410) / 2.23607 = 1.6625, is 1.2% low
    assert mde_factor(5) == pytest.approx(1.6820, abs=1e-4) and mde_factor(5) == pytest.approx(_exact_mde(5, 0.05, 6000), abs=2e-4)
    assert mde_factor(5) > (2.7764 + 0.9410) / math.sqrt(5)
    # n = 10: 0.9960, against the approximation's (2.2622 + 0.8834) / sqrt(10) = 0.99474
    assert mde_factor(10) == pytest.approx(0.9960, abs=1e-4) and mde_factor(10) == pytest.approx(_exact_mde(10, 0.05), abs=2e-4)
    with pytest.raises(ValueError):
        mde_factor(1)


def test_seeds_for_an_effect():
    # sd 0.1, effect 0.1: n = 10 gives 0.9960 x 0.1 = 0.0996 <= 0.1; n = 9: 1.0670 x 0.1 = 0.1067 > 0.1 (exact factors)
    assert mde_factor(10) <= 1.0 < mde_factor(9)
    assert seeds_for(0.1, 0.1) == 10
    assert seeds_for(-0.1, 0.1) == 10  # the sign does not matter
    assert seeds_for(1.0, 0.0) == 2
    with pytest.raises(ValueError):
        seeds_for(0.0, 0.1)


# --- the MDE under Holm, and the effective n ------------------------------------------------------


def _t_cdf_by_simpson(t: float, df: int, steps: int = 20_000) -> float:
    """P(T <= t) by Simpson's rule on the t density (independent of the incomplete beta): 1/2 + integral from 0 to t."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = t / steps
    f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))


def test_the_holm_mde_at_the_issues_numbers():
    # t(1 - 0.05/36, 7) = 4.5062: checked against the t density integrated by Simpson's rule, not the incomplete beta
    assert _t_cdf_by_simpson(4.5062, 7) == pytest.approx(1 - 0.05 / 36, abs=2e-6)
    assert _t_cdf_by_simpson(0.8960, 7) == pytest.approx(0.80, abs=2e-5)
    # n = 8, one true effect among m = 18: the exact power of the t-test (noncentral t) needs 1.9951 x sd, the issue's
    # "about 2.0", against 1.1560 x sd at alpha 0.05 alone: 1.9951 / 1.1560 = 1.7258, the issue's x1.73. The
    # independent quadrature (tests/exact_power.py) gives the same to 1e-4.
    holm8, raw8 = minimum_detectable_effect(1.0, 8, m=18), minimum_detectable_effect(1.0, 8)
    assert holm8 == pytest.approx(1.9951, abs=1e-4) and raw8 == pytest.approx(1.1560, abs=1e-4)
    assert holm8 == pytest.approx(_exact_mde(8, 0.05 / 18), abs=2e-4) and raw8 == pytest.approx(_exact_mde(8, 0.05), abs=2e-4)
    assert holm8 / raw8 == pytest.approx(1.73, abs=0.005)
    # n = 5, m = 20: 3.7759 x sd against 1.6820: 3.7759 / 1.6820 = 2.2449, the issue's x2.24
    assert _t_cdf_by_simpson(6.7583, 4) == pytest.approx(1 - 0.05 / 40, abs=2e-6)
    holm5 = minimum_detectable_effect(1.0, 5, m=20)
    assert holm5 == pytest.approx(3.7759, abs=1e-4) and holm5 == pytest.approx(_exact_mde(5, 0.05 / 20, 6000), abs=2e-4)
    assert holm5 / minimum_detectable_effect(1.0, 5) == pytest.approx(2.24, abs=0.005)
    # The normal-approximation formula the report used before, (t(1 - alpha/(2m), n-1) + t(0.80, n-1)) / sqrt(n),
    # understates both: (4.5062 + 0.8960) / sqrt(8) = 1.9100 (x1.657), (6.7583 + 0.9410) / sqrt(5) = 3.4432 (x2.071)
    assert (4.5062 + 0.8960) / math.sqrt(8) < holm8 and (6.7583 + 0.9410) / math.sqrt(5) < holm5
    # m = 1 is the uncorrected MDE; m below 1 is no family
    assert minimum_detectable_effect(0.1, 5, m=1) == minimum_detectable_effect(0.1, 5)
    with pytest.raises(ValueError):
        minimum_detectable_effect(0.1, 5, m=0)


def test_the_effective_n_leaves_out_the_seeds_where_the_runs_are_the_same():
    # Seeds 0 and 1 are no-ops (difference 0 by construction); seeds 2, 3, 4 differ by 0.1, 0.2, 0.3.
    d = paired_difference({s: 0.5 + x for s, x in enumerate([0.0, 0.0, 0.1, 0.2, 0.3])}, dict.fromkeys(range(5), 0.5),
                          same={0, 1})
    # Everything but the effective n and the MDE is over all 5 seeds: mean 0.12, ties 2
    assert d["n"] == 5 and d["mean"] == pytest.approx(0.12) and d["ties"] == 2
    # over the 3 acting seeds: sd of 0.1, 0.2, 0.3 = 0.1; at df 2 the t-test's power has a closed form,
    # 1 - (1 - alpha) exp(-lambda^2 alpha (2 - alpha) / 2) (tests/lab/test_power.py), so 80% power at
    # lambda^2 = 2 / (alpha (2 - alpha)) ln((1 - alpha) / 0.2): alpha 0.05: 20.51282 x ln(4.75) = 31.96194,
    # d = sqrt(31.96194 / 3) = 3.26404, MDE 0.326404 (the normal approximation said (4.30265 + 1.06066) x 0.1 / sqrt(3) = 0.30966)
    assert d["n_effective"] == 3 and d["sd_effective"] == pytest.approx(0.1)
    assert d["mde_uncorrected"] == pytest.approx(0.326404, abs=1e-6)
    assert d["mde"] == d["mde_uncorrected"]  # a family of one
    # the sd over all 5 seeds counts the two zeros: deviations from 0.12 squared sum to 0.068, sd sqrt(0.068 / 4)
    assert d["sd"] == pytest.approx(math.sqrt(0.068 / 4))
    # In a family of m = 2: Holm's first step tests at 0.05 / 2: 40.50633 x ln(4.875) = 64.16689, d = sqrt(64.16689 / 3)
    # = 4.62482, MDE 0.462482 (the approximation: (6.20535 + 1.06066) x 0.1 / sqrt(3) = 0.41951)
    adjust([d, {"p": 0.5}])
    assert d["m"] == 2 and d["family"] == "all"
    assert d["mde"] == pytest.approx(0.462482, abs=1e-6)
    # fewer than 2 acting seeds: no MDE; no seed left out: the effective n is n and its sd is sd
    assert paired_difference({0: 0.5, 1: 0.7}, {0: 0.5, 1: 0.5}, same={0})["mde"] is None
    whole = paired_difference({0: 0.6, 1: 0.7, 2: 0.9}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert whole["n_effective"] == 3 and whole["sd_effective"] == whole["sd"]
