"""Means with 95% intervals over seeds, and paired differences against a baseline.

With the handful of seeds a lab can afford (5 to 10), the interval is Student's t: mean +- t * s / sqrt(n),
t the 0.975 quantile with n - 1 degrees of freedom. A percentile bootstrap over 5 seeds is
narrower than the data justify (it cannot see tails it never drew), so it is not used. Paired
differences pair the runs of two objectives by seed (same warm start, same prompts at step 1), which
removes the seed's own variance from the comparison. A difference is called distinguishable from
zero when its 95% interval excludes zero; with several objectives and metrics some such calls are
expected by chance alone (1 in 20 per comparison), which the report says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def paired_difference(values: dict[int, float | None], baseline: dict[int, float | None]) -> dict:
    """``values - baseline`` paired by seed: mean, 95% t interval, wins/ties/losses, distinguishable.

    Seeds where either value is missing are left out. ``distinguishable`` is True when the interval
    excludes 0, False when it contains it, None with fewer than 2 pairs.
    """
    seeds = sorted(s for s in values if s in baseline and values[s] is not None and baseline[s] is not None)
    diffs = [values[s] - baseline[s] for s in seeds]
    result = mean_interval(diffs)
    result["wins"] = sum(d > 0 for d in diffs)
    result["ties"] = sum(d == 0 for d in diffs)
    result["losses"] = sum(d < 0 for d in diffs)
    low, high = result["low"], result["high"]
    result["distinguishable"] = None if low is None else bool(low > 0 or high < 0)
    return result
