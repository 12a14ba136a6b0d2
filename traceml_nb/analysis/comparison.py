"""Comparing two runs: what changed, and whether the step time really moved.

The step-time verdict rests on a bootstrap confidence interval of the ratio of median step
times (candidate / baseline): both runs' steady step times are resampled with replacement
``BOOTSTRAP_RESAMPLES`` times with a fixed seed. A change is *significant* when the interval
excludes 1 **and** the medians differ by at least ``MIN_PRACTICAL_EFFECT``; consecutive steps
are not independent, so the interval alone would call noise significant. Given the baseline's
run-to-run noise (:class:`~.model.BaselineNoise`, :mod:`.baseline`), the medians must also
differ by more than that noise's margin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..contracts import PROBLEM_VERDICTS
from .formatting import fmt_mb, fmt_ms, fmt_pct, fmt_rate, fmt_share, signed_pct, signed_points
from .model import BaselineNoise, Diagnosis, Summary
from .thresholds import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE_LEVEL,
    MIN_PRACTICAL_EFFECT,
    NEUTRAL_POINTS,
)

FASTER, SLOWER, NO_CHANGE = "faster", "slower", "no significant change"
GOOD, BAD, NEUTRAL = "good", "bad", "neutral"
NOT_AVAILABLE = "\u2014"
_CHUNK = 256  # bootstrap resamples drawn at once (bounds the index matrix's memory)


class RunLike(Protocol):
    """What :func:`compare` reads from a run (a :class:`traceml_nb.session.history.RunEntry`)."""

    id: int
    summary: Summary
    diagnosis: Diagnosis
    step_ms: list[float]


class ComparisonRow(NamedTuple):
    """One line of the comparison table; ``direction`` is "good", "bad" or "neutral"."""

    label: str
    before: str
    after: str
    delta: str
    direction: str


@dataclass
class Comparison:
    """Run ``candidate_id`` against run ``baseline_id``."""

    baseline_id: int
    candidate_id: int
    rows: list[ComparisonRow] = field(default_factory=list)
    step_ratio: float | None = None  #: median step time of the candidate / of the baseline
    ci_low: float | None = None  #: bootstrap 95% interval of ``step_ratio``
    ci_high: float | None = None
    verdict: str = NO_CHANGE  #: "faster", "slower" or "no significant change"
    headline: str = ""
    #: the baseline's run-to-run noise the verdict was judged against (None: step level only)
    noise: BaselineNoise | None = None
    #: what differs between the two runs (code, settings, environment, load), one item a line
    changes: list[str] = field(default_factory=list)
    #: the runs the baseline is made of (one for a run-to-run comparison)
    baseline_ids: list[int] = field(default_factory=list)
    #: said before the headline, e.g. that the runs are on different hardware classes
    note: str = ""

    @property
    def significant(self) -> bool:
        return self.verdict != NO_CHANGE

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline_id": self.baseline_id,
            "candidate_id": self.candidate_id,
            "rows": [row._asdict() for row in self.rows],
            "step_ratio": self.step_ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
            "headline": self.headline,
            "noise": self.noise.to_dict() if self.noise is not None else None,
            "changes": list(self.changes),
            "baseline_ids": list(self.baseline_ids),
            "note": self.note,
        }

    def to_text(self) -> str:
        """A plain-text table of the comparison."""
        lines = [f"#{self.candidate_id} vs #{self.baseline_id}: {self.headline}"]
        if self.note:
            lines.insert(0, self.note)
        width = max((len(r.label) for r in self.rows), default=0)
        for r in self.rows:
            lines.append(f"  {r.label:<{width}}  {r.before:>14}  \u2192  {r.after:<14}  {r.delta}")
        return "\n".join(lines)


def _medians_of_resamples(
    values: np.ndarray, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Medians of ``resamples`` bootstrap resamples of ``values``.

    With the values sorted, a resample's median is the sorted value at the median of its
    indices, so only integer indices are partitioned, never gathered floats.
    """
    ordered = np.sort(values)
    n = len(ordered)
    lo, hi = (n - 1) // 2, n // 2
    out = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        k = min(_CHUNK, resamples - start)
        idx = np.partition(rng.integers(0, n, size=(k, n)), [lo, hi], axis=1)
        out[start : start + k] = (ordered[idx[:, lo]] + ordered[idx[:, hi]]) / 2
    return out


def bootstrap_ratio_ci(
    baseline: np.ndarray,
    candidate: np.ndarray,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CONFIDENCE_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(candidate) / median(baseline)."""
    rng = np.random.default_rng(seed)
    ratios = _medians_of_resamples(candidate, resamples, rng) / _medians_of_resamples(
        baseline, resamples, rng
    )
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def step_verdict(
    ratio: float, ci_low: float, ci_high: float, margin: float = MIN_PRACTICAL_EFFECT
) -> str:
    """ "faster"/"slower" when the interval excludes 1 and the change is at least ``margin``
    (``MIN_PRACTICAL_EFFECT``, or the baseline noise's margin when that is larger)."""
    if abs(ratio - 1) < max(margin, MIN_PRACTICAL_EFFECT) or ci_low <= 1 <= ci_high:
        return NO_CHANGE
    return FASTER if ratio < 1 else SLOWER


def _median(run: RunLike, values: np.ndarray) -> float | None:
    if run.summary.step_ms_median is not None:
        return run.summary.step_ms_median
    return float(np.median(values)) if len(values) else None


def _relative_row(
    label: str, a: float | None, b: float | None, text: Any, higher_is: str
) -> ComparisonRow:
    """A row whose delta is a relative change; ``higher_is`` good/bad/neutral."""
    if a is None or b is None or a <= 0:
        return ComparisonRow(label, text(a), text(b), NOT_AVAILABLE, NEUTRAL)
    change = b / a - 1
    direction = NEUTRAL
    if higher_is != NEUTRAL and abs(change) >= MIN_PRACTICAL_EFFECT:
        up = change > 0
        direction = higher_is if up else (BAD if higher_is == GOOD else GOOD)
    return ComparisonRow(label, text(a), text(b), signed_pct(change), direction)


def _points_row(
    label: str, a: float | None, b: float | None, text: Any, higher_is: str
) -> ComparisonRow:
    """A row of two percentages (0..100) whose delta is in percentage points."""
    if a is None or b is None:
        return ComparisonRow(label, text(a), text(b), NOT_AVAILABLE, NEUTRAL)
    points = b - a
    direction = NEUTRAL
    if abs(points) >= NEUTRAL_POINTS:
        up = points > 0
        direction = higher_is if up else (BAD if higher_is == GOOD else GOOD)
    return ComparisonRow(label, text(a), text(b), signed_points(points), direction)


def _share_pct(share: float | None) -> float | None:
    return None if share is None else share * 100


def _verdict_row(a: Diagnosis, b: Diagnosis) -> ComparisonRow:
    if a.verdict == b.verdict:
        return ComparisonRow("verdict", a.verdict, b.verdict, "same", NEUTRAL)
    direction = NEUTRAL
    if a.verdict in PROBLEM_VERDICTS and b.verdict == "compute-bound":
        direction = GOOD
    elif a.verdict == "compute-bound" and b.verdict in PROBLEM_VERDICTS:
        direction = BAD
    return ComparisonRow("verdict", a.verdict, b.verdict, "changed", direction)


def _throughput_row(a: Summary, b: Summary) -> ComparisonRow:
    if a.samples_per_s is not None and b.samples_per_s is not None:
        return _relative_row(
            "throughput", a.samples_per_s, b.samples_per_s, lambda v: fmt_rate(v, "samples/s"), GOOD
        )
    return _relative_row(
        "throughput", a.steps_per_s, b.steps_per_s, lambda v: fmt_rate(v, "steps/s"), GOOD
    )


def verdict_tail(verdict: str, noise: BaselineNoise | None) -> str:
    """The words after the change in a headline: ``slower, significant`` (step level only),
    ``slower, beyond the run-to-run noise (±3.0%)``, ``no significant change (within ...)``,
    or with the noise unknown, how many more runs would tell."""
    if noise is None:
        return f"{verdict}, significant" if verdict != NO_CHANGE else NO_CHANGE
    if noise.known:
        if noise.pairwise:
            band = (
                f"the noise between two runs ({noise.runs} baseline runs tell it), "
                f"\u00b1{fmt_pct_plain(noise.margin)}"
            )
        else:
            band = (
                f"the run-to-run noise of {noise.runs} baseline runs, "
                f"\u00b1{fmt_pct_plain(noise.margin)}"
            )
        if verdict == NO_CHANGE:
            return f"{NO_CHANGE}: within {band}"
        return f"{verdict}, beyond {band}"
    more = noise.runs_needed
    unknown = (
        f"run-to-run noise not known yet: {more} more run{'s' if more != 1 else ''} would tell"
    )
    head = f"{verdict}, significant" if verdict != NO_CHANGE else NO_CHANGE
    return f"{head}; {unknown}"


def fmt_pct_plain(share: float) -> str:
    """A fraction as a percentage with one decimal below 10%: 0.031 → '3.1%', 0.12 → '12%'."""
    pct = share * 100
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def compare(a: RunLike, b: RunLike, *, noise: BaselineNoise | None = None) -> Comparison:
    """Run ``b`` (the candidate) against run ``a`` (the baseline); ``noise``: the baseline's
    run-to-run noise, which a change must exceed too (None: the step-level rule alone)."""
    values_a = np.asarray(a.step_ms, dtype=float)
    values_b = np.asarray(b.step_ms, dtype=float)
    med_a, med_b = _median(a, values_a), _median(b, values_b)
    result = Comparison(baseline_id=a.id, candidate_id=b.id, noise=noise, baseline_ids=[a.id])
    # a noise not known yet carries its own, wider margin (UNKNOWN_NOISE_MIN_EFFECT)
    margin = noise.margin if noise is not None else MIN_PRACTICAL_EFFECT
    step_direction = NEUTRAL
    if med_a and med_b and len(values_a) >= 2 and len(values_b) >= 2:
        ratio = med_b / med_a
        low, high = bootstrap_ratio_ci(values_a, values_b)
        result.step_ratio, result.ci_low, result.ci_high = ratio, low, high
        result.verdict = step_verdict(ratio, low, high, margin)
        tail = verdict_tail(result.verdict, noise)
        result.headline = (
            f"step time {fmt_ms(med_a)} \u2192 {fmt_ms(med_b)} ({signed_pct(ratio - 1)}, {tail})"
        )
        step_delta = signed_pct(ratio - 1)
        step_direction = {FASTER: GOOD, SLOWER: BAD}.get(result.verdict, NEUTRAL)
    else:
        missing = [f"#{r.id}" for r, v in ((a, values_a), (b, values_b)) if len(v) < 2]
        verb = "has" if len(missing) == 1 else "have"
        result.headline = (
            f"step time not comparable: {' and '.join(missing)} {verb} no steady steps"
        )
        step_delta = NOT_AVAILABLE
    sa, sb = a.summary, b.summary
    # GPM's SM activity, shown where either run had it (a Hopper or later GPU), after NVML's
    # utilisation, which reads 100% while most SMs idle
    sm_row = _points_row(
        "SM activity", sa.sm_active_median_pct, sb.sm_active_median_pct, fmt_pct, GOOD
    )
    sm_measured = sa.sm_active_median_pct is not None or sb.sm_active_median_pct is not None
    result.rows = [
        ComparisonRow("median step time", fmt_ms(med_a), fmt_ms(med_b), step_delta, step_direction),
        _throughput_row(sa, sb),
        _points_row(
            "data wait",
            _share_pct(sa.data_wait_share),
            _share_pct(sb.data_wait_share),
            lambda v: fmt_share(None if v is None else v / 100),
            BAD,
        ),
        _points_row(
            "GPU utilisation", sa.gpu_util_median_pct, sb.gpu_util_median_pct, fmt_pct, GOOD
        ),
        *([sm_row] if sm_measured else []),
        _relative_row("peak GPU memory", sa.gpu_mem_peak_mb, sb.gpu_mem_peak_mb, fmt_mb, NEUTRAL),
        _verdict_row(a.diagnosis, b.diagnosis),
    ]
    return result
