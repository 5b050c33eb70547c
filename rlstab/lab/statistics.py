"""Means with 95% intervals over seeds, and paired differences against a baseline.

With the handful of seeds a lab can afford (5 to 10), the interval is Student's t: mean +- t * s / sqrt(n),
t the 0.975 quantile with n - 1 degrees of freedom. A percentile bootstrap over 5 seeds is
narrower than the data justify (it cannot see tails it never drew), so it is not used. Paired
differences pair the runs of two objectives by seed (same warm start, same prompts at step 1), which
removes the seed's own variance from the comparison.

Each paired difference also has:

- ``p``: the two-sided paired t-test's p-value, ``t = mean / (sd / sqrt(n))`` with ``n - 1`` degrees
  of freedom (``rlstab.lab.tdist``); with every difference equal, p is 1 when they are 0 and 0 otherwise;
- ``n_effective`` and ``sd_effective``: the seeds where the objective's run is not identical to its
  baseline's (``rlstab.lab.no_ops``), and the differences' sd over those seeds. On a seed where the two
  runs are the same run, the difference is a zero by construction, not a draw of the objective's effect;
- ``mde``: the minimum detectable effect under the report's decision rule, Holm over a family of m
  comparisons: the smallest true mean difference the two-sided paired t-test of the ``n_effective`` seeds
  detects with 80% power at Holm's first step, two-sided alpha 0.05 / m, in units of ``sd_effective``:
  ``mde_factor(n, 0.05 / m) * sd``, the d with ``P(|T'| > t_{1-alpha/(2m), n-1}) = 0.8``, T' noncentral t
  with n - 1 degrees of freedom and noncentrality ``d sqrt(n)`` (``rlstab.lab.power``, which gives the
  integral and its source: Chow, Shao and Wang, *Sample Size Calculations in Clinical Research*, 3.1;
  Cohen 1988). Holm's first step is the Bonferroni level, so this is the MDE of the comparison Holm tests
  first, a lower bound on the others' (their thresholds, alpha / (m - j + 1), are larger only once a smaller
  p has been rejected). At 8 seeds and m = 18 it is 1.995 x sd, against 1.156 x sd at alpha 0.05 alone
  (x1.73); at 5 seeds and m = 20, 3.776 against 1.682 (x2.24). The normal-approximation sample-size formula,
  ``(t_{1-alpha/(2m), n-1} + t_{0.80, n-1}) / sqrt(n)``, understates these by 4% and 9%;
- ``mde_uncorrected``: the same at two-sided alpha 0.05 alone (m = 1), which ignores the decision rule.

The intervals keep the 4-decimal ``t975`` table (so published intervals do not move); p and the MDE
use the exact distributions (t, noncentral t), which agree with the table to 6e-5.

On its own, a difference is *distinguishable* from zero when its 95% interval excludes zero (the
same as p < 0.05, up to the t table's rounding). A report makes many comparisons, so it replaces
that reading with Holm's (``holm``): ``p_holm`` over every comparison of its family, and a
difference is distinguishable when ``p_holm < 0.05``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from rlstab.lab.power import mde_factor
from rlstab.lab.tdist import t_two_sided_p

ALPHA = 0.05
POWER = 0.8

# Student's t, 0.975 quantile, for 1..30 degrees of freedom.
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)
_Z975 = 1.959964


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (a table to 30, then Cornish-Fisher, error < 1e-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_interval(values: Sequence[float | None]) -> dict:
    """``{"mean", "low", "high", "n"}``: the mean and its 95% t interval (None bounds for fewer than 2 values).

    ``None`` values (a metric a run does not have) are left out; NaN is kept and makes the result NaN.
    """
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = sum(xs) / n
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def paired_difference(values: dict[int, float | None], baseline: dict[int, float | None],
                      same: Collection[int] = ()) -> dict:
    """``values - baseline`` paired by seed: mean, 95% t interval, wins/ties/losses, sd, p, p_holm, n_effective,
    sd_effective, mde, mde_uncorrected, distinguishable.

    Seeds where either value is missing are left out. ``same``: the seeds whose two runs are identical
    (``rlstab.lab.no_ops``), left out of ``n_effective``, ``sd_effective`` and the MDEs only.
    ``distinguishable`` is True when the interval excludes 0, False when it contains it, None with fewer
    than 2 pairs. ``p_holm`` is ``p`` and ``mde`` is ``mde_uncorrected``: one comparison is a family of
    one (``adjust`` replaces them for a report's family).
    """
    seeds = sorted(s for s in values if s in baseline and values[s] is not None and baseline[s] is not None)
    diffs = [values[s] - baseline[s] for s in seeds]
    result = mean_interval(diffs)
    result["wins"] = sum(d > 0 for d in diffs)
    result["ties"] = sum(d == 0 for d in diffs)
    result["losses"] = sum(d < 0 for d in diffs)
    low, high = result["low"], result["high"]
    result["distinguishable"] = None if low is None else bool(low > 0 or high < 0)
    n = len(diffs)
    sd = sample_sd(diffs)
    result["sd"] = sd
    result["p"] = paired_p(result["mean"], sd, n)
    result["p_holm"] = result["p"]
    acting = [d for s, d in zip(seeds, diffs) if s not in same]
    result["n_effective"] = len(acting)
    result["sd_effective"] = sd if len(acting) == n else sample_sd(acting)
    result["mde_uncorrected"] = minimum_detectable_effect(result["sd_effective"], len(acting))
    result["mde"] = result["mde_uncorrected"]
    return result


def sample_sd(xs: Sequence[float]) -> float | None:
    """The sample standard deviation (n - 1), None below 2 values."""
    n = len(xs)
    if n < 2:
        return None
    mean = sum(xs) / n
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


def paired_p(mean: float | None, sd: float | None, n: int) -> float | None:
    """Two-sided p of the paired t-test, ``t = mean / (sd / sqrt(n))``, df ``n - 1``; None below 2 pairs or for NaN."""
    if n < 2 or mean is None or sd is None or math.isnan(mean) or math.isnan(sd):
        return None
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return t_two_sided_p(mean / (sd / math.sqrt(n)), n - 1)


def minimum_detectable_effect(sd: float | None, n: int, m: int = 1) -> float | None:
    """The smallest true mean difference the two-sided paired t-test of ``n`` pairs detects with 80% power at Holm's
    first step over ``m`` comparisons, two-sided alpha 0.05 / m: ``mde_factor(n, 0.05 / m) * sd``, the exact
    (noncentral t) minimum detectable effect of ``rlstab.lab.power``; None below 2 pairs."""
    if sd is None or n < 2 or math.isnan(sd):
        return None
    if m < 1:
        raise ValueError(f"m = {m}: a family has at least one comparison")
    return mde_factor(n, ALPHA / m) * sd


def seeds_for(effect: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """The fewest seeds whose paired t-test detects ``effect`` with that power: the least n >= 2 with
    ``mde_factor(n, alpha, power) * sd <= |effect|`` (the exact power, ``rlstab.lab.power``)."""
    if effect == 0 or sd < 0:
        raise ValueError(f"effect {effect}, sd {sd}: a non-zero effect and a non-negative sd")
    n = 2
    while mde_factor(n, alpha, power) * sd > abs(effect):
        n += 1
    return n


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input's order (Holm 1979, "A simple sequentially
    rejective multiple test procedure", Scand. J. Statist. 6: 65-70).

    With the m p-values that are not None sorted ascending, p_(1) <= ... <= p_(m), the adjusted
    ``p~_(i) = max over j <= i of min(1, (m - j + 1) * p_(j))``. Rejecting where ``p~ < alpha``
    keeps the chance of any false rejection among the m at most alpha, whatever their dependence.
    None stays None and does not count in m.
    """
    present = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(present)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def adjust(differences: Sequence[dict], family: str = "all") -> None:
    """Holm over ``differences`` (one family of a report's comparisons), in place: each gets ``p_holm``,
    ``family`` and ``m`` (the family's comparisons with a p), its ``mde`` at Holm's first step, alpha 0.05 / m,
    over its ``n_effective`` seeds, and ``distinguishable`` becomes ``p_holm < 0.05`` (None where there is no p)."""
    adjusted = holm([d.get("p") for d in differences])
    m = sum(p is not None for p in adjusted)
    for d, p in zip(differences, adjusted):
        d["p_holm"] = p
        d["distinguishable"] = None if p is None else bool(p < ALPHA)
        d["family"] = family
        d["m"] = m
        d["mde"] = minimum_detectable_effect(d.get("sd_effective"), d.get("n_effective", 0), max(m, 1))
