"""The exact power of a two-sided paired t-test (noncentral t), computed by another quadrature: an independent check of
the lab's exact MDE, rlstab.lab.power (tests/lab/test_power.py, tests/lab/test_statistics.py, tests/docs/test_lab_page.py)."""

import math

from rlstab.lab.tdist import t_quantile


def exact_mde(n: int, alpha: float, steps: int = 1500) -> float:
    """The effect (in sd) the two-sided paired t-test of ``n`` pairs detects with exactly 80% power: the power is the
    noncentral t's, lam = effect x sqrt(n), the mean over V ~ chi2(n - 1) of Phi(lam - c s) + Phi(-lam - c s) with
    s = sqrt(V / df), by the midpoint rule over V in [0, 60 df]; bisection on the effect in [0, 6]. Independent of
    rlstab.lab.power's Simpson rule over S and Newton steps."""
    df = n - 1
    c = t_quantile(1 - alpha / 2, df)
    h = 60.0 * df / steps
    grid = [((i + 0.5) * h) for i in range(steps)]
    weights = [math.exp(-(df / 2) * math.log(2) - math.lgamma(df / 2) + (df / 2 - 1) * math.log(v) - v / 2) * h for v in grid]
    cuts = [c * math.sqrt(v / df) for v in grid]

    def power(effect: float) -> float:
        lam = effect * math.sqrt(n)
        return sum(w * 0.5 * (2 + math.erf((lam - k) / math.sqrt(2)) + math.erf((-lam - k) / math.sqrt(2)))
                   for w, k in zip(weights, cuts))

    low, high = 0.0, 6.0
    for _ in range(16):
        mid = (low + high) / 2
        low, high = (mid, high) if power(mid) < 0.8 else (low, mid)
    return (low + high) / 2
