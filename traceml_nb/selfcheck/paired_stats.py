"""Statistics of paired timings: what a variant of a loop (traced, monitored, profiled) adds to
the plain loop, and the steady-step medians of a run's step table.

A *pair* is one plain and one variant measurement taken next to each other: a repetition of
the whole loop under each, or two blocks of steps taken in ``plain, variant, variant, plain,
...`` order. What drifts slowly on a machine (clocks, caches, other processes) hits both halves
of a pair alike, so it cancels in their difference, and the pairs are the units an interval
resamples.

Pure functions on plain numbers: no torch, no numpy, so a benchmark or a test can import this
module cheaply. Units are those of the inputs (the checks pass nanoseconds from
``time.perf_counter_ns``) unless a name says otherwise: ``_us`` microseconds, ``_ms``
milliseconds, ``_pct`` percent.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple


class Estimate(NamedTuple):
    """A median and the interval around it, in the unit of the function that returns it."""

    median: float
    low: float
    high: float


# --- units ---------------------------------------------------------------------------------------
def per_step_us(total_ns: float, steps: int) -> float:
    """Microseconds per step of ``total_ns`` nanoseconds spent over ``steps`` steps."""
    return total_ns / steps / 1e3


def percent_of(value: float, base: float) -> float:
    """``value`` as a percentage of ``base`` (both in the same unit)."""
    return 100.0 * value / base


# --- pairs, quantiles, intervals -----------------------------------------------------------------
def paired_differences(plain: Sequence[float], variant: Sequence[float]) -> list[float]:
    """``variant[i] - plain[i]`` for each pair ``i``, in the unit of the inputs.

    Raises ``ValueError`` unless both hold the same, non-zero number of measurements.
    """
    if len(plain) == 0 or len(plain) != len(variant):
        raise ValueError("need the same, non-zero number of plain and variant measurements")
    return [v - p for p, v in zip(plain, variant, strict=True)]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (``0 <= q <= 1``) of ``values``, interpolating linearly between the
    two nearest order statistics (the rule numpy uses by default); in the unit of ``values``."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be between 0 and 1, not {q}")
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """The median of ``values`` and a distribution-free interval for it, in their unit.

    The interval runs from the ``k``-th smallest to the ``k``-th largest value, with ``k`` the
    largest rank for which a ``Binomial(n, 1/2)`` count falls below ``k`` with probability at
    most ``(1 - confidence) / 2``: it holds the true median with at least ``confidence``
    probability whatever the distribution, assuming only independent values. With too few
    values for that (fewer than 6 at 95%) it is the whole range, min to max, whose coverage
    is then only ``1 - 2**(1 - n)``.
    """
    _check_confidence(confidence)
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of no values")
    tail = (1.0 - confidence) / 2.0
    k = 0  # the largest rank found whose lower tail is at most ``tail``
    below = 0  # outcomes 0 .. k - 1 of Binomial(n, 1/2), times 2**n
    while k + 1 <= n - k and (below + math.comb(n, k)) / 2**n <= tail:
        below += math.comb(n, k)
        k += 1
    k = max(k, 1)  # rank 1 at least: the whole range
    return Estimate(statistics.median(ordered), ordered[k - 1], ordered[n - k])


def bootstrap_interval(
    statistic: Callable[[list[int]], float],
    pairs: int,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile bootstrap interval ``(low, high)`` of ``statistic``, in its unit.

    ``statistic`` receives the indices of a resample: ``pairs`` indices drawn from
    ``range(pairs)`` with replacement (a pair drawn twice counts twice). The interval runs
    between the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the
    ``resamples`` values it returns. The same ``seed`` gives the same interval.
    """
    _check_confidence(confidence)
    if pairs <= 0:
        raise ValueError("need at least one pair to resample")
    rng = random.Random(seed)
    population = range(pairs)
    boot = [statistic(rng.choices(population, k=pairs)) for _ in range(resamples)]
    tail = (1.0 - confidence) / 2.0
    return quantile(boot, tail), quantile(boot, 1.0 - tail)


def median_difference(
    plain: Sequence[Sequence[float]],
    variant: Sequence[Sequence[float]],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """What the variant adds: the median of all variant measurements minus the median of all
    plain ones, in their unit (per step when each value is one step's time).

    ``plain[i]`` and ``variant[i]`` are the two blocks of pair ``i`` (one value each: a block of
    one). The interval is a percentile bootstrap (:func:`bootstrap_interval`) that resamples
    whole pairs, so the drift between pairs, which the pairing cancels, is not counted as noise,
    and the steps of a block are not taken as independent.
    """
    if len(plain) == 0 or len(plain) != len(variant):
        raise ValueError("need the same, non-zero number of plain and variant blocks")
    plain_rows = [[float(x) for x in block] for block in plain]  # once: numpy rows iterate slowly
    variant_rows = [[float(x) for x in block] for block in variant]

    def difference(pick: Iterable[int]) -> float:
        chosen = list(pick)
        v = statistics.median(x for i in chosen for x in variant_rows[i])
        p = statistics.median(x for i in chosen for x in plain_rows[i])
        return v - p

    point = difference(range(len(plain)))
    low, high = bootstrap_interval(difference, len(plain), confidence, resamples, seed)
    return Estimate(point, low, high)


def added_per_step_us(
    plain_ns: Sequence[int], variant_ns: Sequence[int], steps: int, confidence: float = 0.95
) -> Estimate:
    """Added time per step, microseconds, from paired repetitions of a ``steps``-step loop
    (``plain_ns[i]``, ``variant_ns[i]``: whole-loop nanoseconds of pair ``i``): the median over
    the pairs of ``(variant - plain) / steps`` and its order-statistic interval
    (:func:`median_interval`)."""
    return median_interval(
        [per_step_us(d, steps) for d in paired_differences(plain_ns, variant_ns)], confidence
    )


# --- what the self-check's checks use ------------------------------------------------------------
def paired_added(plain_ns: Sequence[int], traced_ns: Sequence[int], steps: int) -> dict[str, float]:
    """Added time of traced over plain per repetition pair (``*_ns``: whole-loop nanoseconds of
    a ``steps``-step loop, pair ``i`` at index ``i``).

    ``median_us``, ``min_us``, ``max_us``: over the pairs, microseconds added per step;
    ``median_pct``, ``min_pct``, ``max_pct``: the same as percent of that pair's plain loop;
    ``plain_step_ms``: the median plain loop per step, milliseconds; ``pairs``: how many.
    """
    diffs = paired_differences(plain_ns, traced_ns)
    us = [per_step_us(d, steps) for d in diffs]
    pct = [percent_of(d, p) for p, d in zip(plain_ns, diffs, strict=True)]
    return {
        "median_us": statistics.median(us),
        "min_us": min(us),
        "max_us": max(us),
        "median_pct": statistics.median(pct),
        "min_pct": min(pct),
        "max_pct": max(pct),
        "plain_step_ms": statistics.median(plain_ns) / steps / 1e6,
        "pairs": len(us),
    }


def steady_medians(
    source: Sequence[int],
    flags: Sequence[int],
    stall_ms: Sequence[float],
    span_ms: Sequence[float],
    wait_ns: Sequence[int],
    wall_ns: Sequence[int],
    slot: int = 0,
    skip: int = 3,
) -> dict[str, Any]:
    """Medians over the steady steps of a run's step columns: the steps of loader ``slot``,
    leaving out the first ``skip`` (warm-up) and those the end of the run truncated.

    ``rows``: steps counted; ``unresolved``: of those, steps whose GPU columns are still NaN
    (their CUDA events never completed); ``stall_ms``, ``span_ms``: median GPU input stall and
    GPU span, milliseconds, over the resolved steps (``None`` without any); ``wait_ms``: median
    host wait for the batch, milliseconds; ``host_ms``: median host time of a step outside that
    wait, milliseconds.
    """
    # Imported here: the step table's flags are all this module needs from the record.
    from ..engine.record import FLAG_TRUNCATED

    rows = [i for i in range(len(source)) if source[i] == slot and not flags[i] & FLAG_TRUNCATED][
        skip:
    ]
    stalls = [stall_ms[i] for i in rows if not math.isnan(stall_ms[i])]
    spans = [span_ms[i] for i in rows if not math.isnan(span_ms[i])]
    return {
        "rows": len(rows),
        "unresolved": len(rows) - len(stalls),
        "stall_ms": statistics.median(stalls) if stalls else None,
        "span_ms": statistics.median(spans) if spans else None,
        "wait_ms": statistics.median(wait_ns[i] / 1e6 for i in rows) if rows else None,
        "host_ms": statistics.median((wall_ns[i] - wait_ns[i]) / 1e6 for i in rows)
        if rows
        else None,
    }
