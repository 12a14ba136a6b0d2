"""Student's t distribution, for the verdicts that judge a change against run-to-run noise.

The comparisons (:mod:`.noise`) and the A/B gate (:mod:`.paired`) put a change between
confidence bounds whose width comes from a noise estimated from few runs; the t distribution
with the estimate's degrees of freedom is what makes those bounds honest with 2 runs as with
20. numpy has no quantile function for it and scipy is not a dependency, so it is computed
here: the regularised incomplete beta function by its continued fraction (Lentz's method),
the quantile by bisection on the distribution function. Accurate to ~1e-10.
"""

from __future__ import annotations

import functools
import math

_EPS = 1e-14
_TINY = 1e-300
_MAX_TERMS = 300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), None):
            if aa is None:
                aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom (``df`` may be fractional;
    ``math.inf``: the standard normal)."""
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0 < p < 1) of Student's t with ``df`` > 0 degrees of freedom:
    ``t_quantile(0.975, 4)`` = 2.776. Cached: the verdicts ask for few distinct levels."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be inside (0, 1), got {p!r}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


def f_sf(f: float, df1: float, df2: float) -> float:
    """P(F > f) for Fisher's F with ``df1`` and ``df2`` > 0 degrees of freedom: the chance that
    a variance on ``df1`` exceeds one on ``df2`` by the ratio ``f`` when both estimate the same
    variance. ``f_sf(3.84, 1, 1e9)`` ≈ 0.05."""
    if f <= 0.0:
        return 1.0
    return incomplete_beta(df2 / 2.0, df1 / 2.0, df2 / (df2 + df1 * f))
