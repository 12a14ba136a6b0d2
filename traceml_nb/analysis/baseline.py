"""Baselines that know their noise: a run judged against several earlier runs, not one.

Two identical runs on a shared machine differ by more than their steps suggest (the machine's
load, the page cache, the CPU's clock), so a step-level bootstrap alone calls noise
significant. The baseline of a run is its last ``BASELINE_RUNS`` earlier runs (or a pinned
set); their median step times scatter by the *run-to-run noise*, estimated robustly
(:func:`baseline_noise`). A run is slower or faster only when its median moved

* beyond ``MIN_PRACTICAL_EFFECT`` (5%), **and**
* beyond ``NOISE_MULTIPLIER`` robust standard deviations of the baseline runs' medians, **and**
* the bootstrap interval of the ratio (the candidate's steps against the baseline runs' steps
  pooled) excludes 1.

With fewer than ``MIN_BASELINE_RUNS`` baseline runs the noise is unknown: the step-level rule
judges, with ``UNKNOWN_NOISE_MIN_EFFECT`` (10%) as the least change that counts, and the
headline says how many more runs would tell.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from statistics import median

import numpy as np

from .comparison import (
    FASTER,
    NO_CHANGE,
    SLOWER,
    Comparison,
    ComparisonRow,
    RunLike,
    bootstrap_ratio_ci,
    compare,
    step_verdict,
    verdict_tail,
)
from .formatting import fmt_ms, signed_pct
from .model import BaselineNoise
from .thresholds import (
    MAD_TO_SIGMA,
    MAX_STORED_STEPS,
    MIN_BASELINE_RUNS,
    MIN_PRACTICAL_EFFECT,
    NOISE_MULTIPLIER,
    UNKNOWN_NOISE_MIN_EFFECT,
)


def baseline_noise(medians: Sequence[float | None]) -> BaselineNoise:
    """The run-to-run noise of baseline runs whose median step times (ms) are ``medians``
    (``None`` entries are left out); see :class:`~.model.BaselineNoise`."""
    values = [float(m) for m in medians if m is not None and m > 0]
    if not values:
        return BaselineNoise(0, None, None, UNKNOWN_NOISE_MIN_EFFECT, MIN_BASELINE_RUNS)
    center = median(values)
    if len(values) < MIN_BASELINE_RUNS:
        return BaselineNoise(
            len(values), center, None, UNKNOWN_NOISE_MIN_EFFECT, MIN_BASELINE_RUNS - len(values)
        )
    mad = median(abs(v - center) for v in values)
    spread = MAD_TO_SIGMA * mad / center
    return BaselineNoise(
        len(values), center, spread, max(MIN_PRACTICAL_EFFECT, NOISE_MULTIPLIER * spread), 0
    )


def pairwise_noise(noise: BaselineNoise) -> BaselineNoise:
    """The noise of one run against one other (the previous run, the best run), from the
    baseline's: each of the two runs scatters by ``spread``, so their ratio scatters by
    √2 × ``spread``, and the margin is ``NOISE_MULTIPLIER`` times that (at least
    ``MIN_PRACTICAL_EFFECT``). A noise not known yet is left as it is."""
    if noise.spread is None:
        return noise
    spread = math.sqrt(2.0) * noise.spread
    return replace(
        noise,
        spread=spread,
        margin=max(MIN_PRACTICAL_EFFECT, NOISE_MULTIPLIER * spread),
        pairwise=True,
    )


def pooled_steps(runs: Sequence[RunLike], limit: int = MAX_STORED_STEPS) -> np.ndarray:
    """The runs' steady step times together, each run evenly thinned to an equal share of
    ``limit`` values (so that a long run does not outweigh the others, and the bootstrap stays
    bounded)."""
    share = max(2, limit // max(1, len(runs)))
    parts = []
    for run in runs:
        values = np.asarray(run.step_ms, dtype=float)
        if len(values) > share:
            values = values[np.linspace(0, len(values) - 1, share).round().astype(int)]
        parts.append(values)
    return np.concatenate(parts) if parts else np.empty(0)


def compare_with_baseline(
    baseline: Sequence[RunLike], candidate: RunLike, *, noise: BaselineNoise | None = None
) -> Comparison:
    """``candidate`` against the runs of ``baseline`` (oldest first; at least one).

    The table's "before" column is the latest baseline run, except the median step time: the
    median of the baseline runs' medians. ``noise`` defaults to :func:`baseline_noise` of the
    baseline runs.
    """
    if not baseline:
        raise ValueError("a baseline needs at least one run")
    if noise is None:
        noise = baseline_noise([r.summary.step_ms_median for r in baseline])
    latest = baseline[-1]
    result = compare(latest, candidate, noise=noise)
    result.baseline_ids = [r.id for r in baseline]
    if len(baseline) == 1 or noise.center_ms is None:
        return result
    pooled = pooled_steps(baseline)
    values = np.asarray(candidate.step_ms, dtype=float)
    cand = candidate.summary.step_ms_median
    if cand is None and len(values):
        cand = float(np.median(values))
    if not cand or len(values) < 2 or len(pooled) < 2:
        return result
    center = noise.center_ms
    ratio = cand / center
    low, high = bootstrap_ratio_ci(pooled, values)
    result.step_ratio, result.ci_low, result.ci_high = ratio, low, high
    result.verdict = step_verdict(ratio, low, high, noise.margin)
    result.headline = (
        f"step time {fmt_ms(center)} \u2192 {fmt_ms(cand)} ({signed_pct(ratio - 1)}, "
        f"{verdict_tail(result.verdict, noise)})"
    )
    direction = {FASTER: "good", SLOWER: "bad"}.get(result.verdict, "neutral")
    first = result.rows[0]
    result.rows[0] = ComparisonRow(
        f"{first.label} (median of {len(baseline)} runs)",
        fmt_ms(center),
        first.after,
        signed_pct(ratio - 1),
        direction,
    )
    return result


def is_regression(comparison: Comparison, max_slowdown: float) -> bool:
    """The comparison shows a slowdown beyond ``max_slowdown`` (a fraction, e.g. 0.10), beyond
    the baseline's noise and the step-level bootstrap (its verdict is "slower")."""
    ratio = comparison.step_ratio
    return comparison.verdict == SLOWER and ratio is not None and ratio - 1 > max_slowdown


__all__ = [
    "NO_CHANGE",
    "baseline_noise",
    "pairwise_noise",
    "compare_with_baseline",
    "is_regression",
    "pooled_steps",
]
