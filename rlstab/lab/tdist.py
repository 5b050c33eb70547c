"""Student's t distribution: its CDF, two-sided p-values and quantiles, from the regularized incomplete beta.

The lab needs t only for a handful of seeds, and its core dependencies have no statistics library,
so the three functions are computed here from their textbook definitions:

- the regularized incomplete beta ``I_x(a, b) = B(x; a, b) / B(a, b)``, by its continued fraction
  (Abramowitz and Stegun 26.5.8), evaluated with the modified Lentz method, and by the symmetry
  ``I_x(a, b) = 1 - I_{1-x}(b, a)`` where the fraction converges slowly (x > (a + 1) / (a + b + 2));
- Student's t with ``df`` degrees of freedom: for t >= 0, ``P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2``
  (Abramowitz and Stegun 26.7.1 with 26.5.27), so the two-sided p-value of ``|T| >= |t|`` is
  ``I_{df/(df+t^2)}(df/2, 1/2)``;
- the quantile ``t_q`` by bisection on that CDF (monotone), to about 1e-12.
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300


def _fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b) (A&S 26.5.8), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            f *= c * d
        if abs(c * d - 1.0) < _EPS:
            break
    return f


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for 0 <= x <= 1 and a, b > 0."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x = {x}: between 0 and 1")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _fraction(1.0 - x, b, a) / b


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = t_two_sided_p(t, df) / 2.0
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q = {q}: strictly between 0 and 1")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < q:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0
