"""Comparing runs: what changed, and whether the step time really moved.

The step-time verdict is the run-to-run noise model's (:mod:`.noise`, :mod:`.judge`): the
change of the (geometric) mean of the runs' median step times, judged against the noise of
their configurations, with Student's t bounds for how little few runs tell. "Slower" or
"faster" also needs the step-level bootstrap interval of the ratio of median step times
(``BOOTSTRAP_RESAMPLES`` resamples of both runs' steady steps, fixed seed) to exclude 1:
where the steps themselves cannot tell, the verdict is inconclusive.

Runs whose steps hold different numbers of samples (the batch size changed by
``BATCH_SIZE_CHANGE_SHARE`` or more) are compared per sample: the verdict judges the median step
time divided by the run's batch size, since a step twice as long over twice the samples is no
slowdown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..engine.contracts import PROBLEM_VERDICTS
from .findings import Diagnosis, Summary
from .formatting import fmt_mb, fmt_ms, fmt_pct, fmt_rate, fmt_share, signed_pct, signed_points
from .judge import FASTER, INCONCLUSIVE, NO_CHANGE, SLOWER, Judgement
from .noise import Noise, estimate_noise, judge_change, log_mean_ms
from .phase_shift import PART_NAMES, PhaseShift, part_ms, phase_shift
from .step_anatomy import PHASES
from .thresholds import (
    BATCH_SIZE_CHANGE_SHARE,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CHANGE_MARGIN,
    CONFIDENCE_LEVEL,
    MAX_STORED_STEPS,
    MIN_PRACTICAL_EFFECT,
    NEUTRAL_POINTS,
)

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
    #: median step time of the candidate / of the baseline; per sample where ``batch_sizes``
    #: is set (the ratio the verdict judges)
    step_ratio: float | None = None
    ci_low: float | None = None  #: bootstrap 95% interval of ``step_ratio``
    ci_high: float | None = None
    #: "faster", "slower", "no significant change" or "inconclusive"
    verdict: str = NO_CHANGE
    #: the step time of each side, ms: the geometric mean of the runs' medians (None: a side
    #: without steady steps)
    before_ms: float | None = None
    after_ms: float | None = None
    #: the runs without steady steps, when the step time is not comparable
    no_steady_ids: list[int] = field(default_factory=list)
    #: the noise model saw a change, but the step-level bootstrap interval includes none
    steps_overlap: bool = False
    #: the run-to-run noise the verdict was judged against
    noise: Noise | None = None
    #: the verdict's figures: the change, its bounds, how many more runs would decide
    judgement: Judgement | None = None
    #: what differs between the two runs (code, settings, environment, load), one item a line
    changes: list[str] = field(default_factory=list)
    #: the runs the baseline is made of (one for a run-to-run comparison)
    baseline_ids: list[int] = field(default_factory=list)
    #: the runs the candidate is made of (one but for ``check --runs K``)
    candidate_ids: list[int] = field(default_factory=list)
    #: said before the headline, e.g. that the runs are on different hardware classes
    note: str = ""
    #: the parts of the configuration that differ between the baseline and the candidate
    #: (:func:`~.configuration.changed_parts`: "code", "loader", "versions", "hardware")
    changed_parts: tuple[str, ...] = ()
    #: the candidate ran on a busy machine and its baseline did not: judged with
    #: ``BUSY_NOISE_FACTOR`` times the noise
    after_busy: bool = False
    #: which parts of the step moved (:mod:`.phase_shift`); None: not both runs timed them
    phase_shift: PhaseShift | None = None
    #: the samples per step of each side (its runs' median batch size; the geometric mean of
    #: them where they differ) where the two differ by ``BATCH_SIZE_CHANGE_SHARE`` or more: the
    #: step times are then judged per sample; None where they do not or a run's is unknown
    batch_sizes: tuple[float, float] | None = None

    def judged_ms(self) -> tuple[float | None, float | None]:
        """What the verdict judges of each side, ms: the step times (``before_ms``,
        ``after_ms``), or the times per sample where ``batch_sizes`` is set."""
        if self.batch_sizes is None:
            return self.before_ms, self.after_ms
        a, b = self.before_ms, self.after_ms
        size_a, size_b = self.batch_sizes
        return (None if a is None else a / size_a), (None if b is None else b / size_b)

    @property
    def significant(self) -> bool:
        return self.verdict in (FASTER, SLOWER)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline_id": self.baseline_id,
            "candidate_id": self.candidate_id,
            "rows": [row._asdict() for row in self.rows],
            "step_ratio": self.step_ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
            "before_ms": self.before_ms,
            "after_ms": self.after_ms,
            "no_steady_ids": list(self.no_steady_ids),
            "steps_overlap": self.steps_overlap,
            "noise": self.noise.to_dict() if self.noise is not None else None,
            "judgement": self.judgement.to_dict() if self.judgement is not None else None,
            "after_busy": self.after_busy,
            "changed_parts": list(self.changed_parts),
            "changes": list(self.changes),
            "baseline_ids": list(self.baseline_ids),
            "candidate_ids": list(self.candidate_ids),
            "note": self.note,
            "phase_shift": asdict(self.phase_shift) if self.phase_shift is not None else None,
            "batch_sizes": list(self.batch_sizes) if self.batch_sizes is not None else None,
        }


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


def _median(run: RunLike, values: np.ndarray) -> float | None:
    if run.summary.step_ms_median is not None:
        return run.summary.step_ms_median
    return float(np.median(values)) if len(values) else None


def _relative_row(
    label: str,
    a: float | None,
    b: float | None,
    text: Callable[[float | None], str],
    higher_is: str,
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
    label: str,
    a: float | None,
    b: float | None,
    text: Callable[[float | None], str],
    higher_is: str,
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


def _mfu_row(sa: Summary, sb: Summary) -> ComparisonRow:
    """The MFU's row; a lower bound (operators without a FLOP formula ran: ``uncounted_ops``)
    reads "at least", and its change is told only against a lower bound of the same operators
    (between others, the uncounted work may be all of the change)."""
    row = _points_row(
        "MFU",
        _share_pct(sa.mfu),
        _share_pct(sb.mfu),
        lambda v: fmt_share(None if v is None else v / 100),
        GOOD,
    )
    if not (sa.uncounted_ops or sb.uncounted_ops):
        return row
    before, after = (
        ("at least " if s.uncounted_ops and s.mfu is not None else "") + text
        for s, text in ((sa, row.before), (sb, row.after))
    )
    if sorted(sa.uncounted_ops) != sorted(sb.uncounted_ops):
        return row._replace(before=before, after=after, delta=NOT_AVAILABLE, direction=NEUTRAL)
    return row._replace(before=before, after=after)


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


def pooled_steps(
    runs: Sequence[RunLike], limit: int = MAX_STORED_STEPS, per_sample: bool = False
) -> np.ndarray:
    """The runs' steady step times together, each run evenly thinned to an equal share of
    ``limit`` values (so that a long run does not outweigh the others, and the bootstrap stays
    bounded); with ``per_sample``, each divided by its run's batch size."""
    share = max(2, limit // max(1, len(runs)))
    parts = []
    for run in runs:
        values = np.asarray(run.step_ms, dtype=float)
        if len(values) > share:
            values = values[np.linspace(0, len(values) - 1, share).round().astype(int)]
        parts.append(values / _batch_size(run) if per_sample else values)
    return np.concatenate(parts) if parts else np.empty(0)


def _steps(run: RunLike, per_sample: bool) -> np.ndarray:
    values = np.asarray(run.step_ms, dtype=float)
    return values / _batch_size(run) if per_sample else values


def _medians_with_sizes(runs: Sequence[RunLike]) -> list[tuple[float, float]]:
    """``(median step ms, batch size)`` of each run that has a median step."""
    sized = [(_median(r, np.asarray(r.step_ms, dtype=float)), _batch_size(r)) for r in runs]
    return [(m, size) for m, size in sized if m]


def _batch_size(run: RunLike) -> float:
    return float(run.summary.batch_size or 1)


def _side_batch_size(runs: Sequence[RunLike]) -> float:
    """The batch size of a side's runs: theirs where they share one, else the geometric mean."""
    sizes = {_batch_size(r) for r in runs}
    return sizes.pop() if len(sizes) == 1 else log_mean_ms([_batch_size(r) for r in runs])


def batch_sizes_differ(sizes: Iterable[float | None]) -> bool:
    """Every batch size of ``sizes`` is known (positive) and the largest is
    ``BATCH_SIZE_CHANGE_SHARE`` or more over the smallest: steps are then compared per sample."""
    known = []
    for size in sizes:
        if size is None or not size > 0:
            return False
        known.append(size)
    return bool(known) and max(known) / min(known) >= 1 + BATCH_SIZE_CHANGE_SHARE


def _batch_sizes(
    runs_a: Sequence[RunLike], runs_b: Sequence[RunLike]
) -> tuple[float, float] | None:
    """Each side's samples per step (:func:`_side_batch_size`) where every run's is known and
    the two differ by ``BATCH_SIZE_CHANGE_SHARE`` or more, else None."""
    if not batch_sizes_differ(r.summary.batch_size for r in [*runs_a, *runs_b]):
        return None  # an unknown size, or none differs by the share: neither do the sides
    size_a, size_b = _side_batch_size(runs_a), _side_batch_size(runs_b)
    return (size_a, size_b) if batch_sizes_differ((size_a, size_b)) else None


def _means_of(before: int, after: int) -> str:
    """What the step time row's figures are: `` (mean of 5 runs)``, `` (means of 5 and 3
    runs)``, `` (mean of 3 runs after)``; '' for one run against one."""
    if before > 1 and after > 1:
        return f" (means of {before} and {after} runs)"
    if before > 1:
        return f" (mean of {before} runs)"
    if after > 1:
        return f" (mean of {after} runs after)"
    return ""


def compare(
    a: RunLike,
    b: RunLike,
    *,
    before: Sequence[RunLike] | None = None,
    after: Sequence[RunLike] | None = None,
    noise: Noise | None = None,
    margin: float = CHANGE_MARGIN,
    one_sided: bool = False,
    after_busy: bool = False,
) -> Comparison:
    """Run ``b`` (the candidate) against run ``a``, or against the runs ``before`` (a baseline,
    oldest first; ``a`` is the latest of them and fills the table's other rows); ``after``:
    the candidate's runs when it is several (oldest first; ``b`` is the latest of them).

    The step time's verdict (:func:`.noise.judge_change`) judges the geometric mean of the
    candidate's medians against that of the earlier medians with ``noise`` (default:
    :func:`.noise.estimate_noise` of the earlier runs alone) and ``margin`` (the least change
    that matters; ``one_sided``: a gate's question, is it slower); ``after_busy``: the
    candidate ran on a busy machine. "Slower"/"faster" also needs the step-level bootstrap
    interval to exclude 1."""
    runs_a = [a] if not before else list(before)
    runs_b = [b] if not after else list(after)
    sizes = _batch_sizes(runs_a, runs_b)
    per_sample = sizes is not None
    values_a = _steps(a, per_sample) if not before else pooled_steps(runs_a, per_sample=per_sample)
    values_b = _steps(b, per_sample) if not after else pooled_steps(runs_b, per_sample=per_sample)
    sized_a, sized_b = _medians_with_sizes(runs_a), _medians_with_sizes(runs_b)
    medians_a, medians_b = [m for m, _ in sized_a], [m for m, _ in sized_b]
    med_b = log_mean_ms(medians_b) if len(medians_b) == len(runs_b) else None
    result = Comparison(baseline_id=a.id, candidate_id=b.id, baseline_ids=[r.id for r in runs_a])
    result.candidate_ids = [r.id for r in runs_b]
    step_direction = NEUTRAL
    center = log_mean_ms(medians_a) if medians_a else None
    if center and med_b and len(values_a) >= 2 and len(values_b) >= 2:
        judged_a, judged_b = medians_a, medians_b
        if per_sample:
            judged_a = [m / size for m, size in sized_a]
            judged_b = [m / size for m, size in sized_b]
            result.batch_sizes = sizes
        if noise is None:
            noise = estimate_noise([medians_a], center)
        judgement = judge_change(
            judged_a, judged_b, noise, margin, one_sided=one_sided, after_busy=after_busy
        )
        ratio = log_mean_ms(judged_b) / log_mean_ms(judged_a)
        low, high = bootstrap_ratio_ci(values_a, values_b)
        result.step_ratio, result.ci_low, result.ci_high = ratio, low, high
        result.noise, result.judgement = noise, judgement
        result.verdict, result.after_busy = judgement.verdict, after_busy
        result.before_ms, result.after_ms = center, med_b
        if result.verdict in (FASTER, SLOWER) and low <= 1 <= high:
            result.verdict, result.steps_overlap = INCONCLUSIVE, True
        step_delta = signed_pct(med_b / center - 1)
        step_direction = {FASTER: GOOD, SLOWER: BAD}.get(result.verdict, NEUTRAL)
    else:
        empty = [(a, values_a)] if not before else [(r, np.asarray(r.step_ms)) for r in runs_a]
        later = [(b, values_b)] if not after else [(r, np.asarray(r.step_ms)) for r in runs_b]
        result.no_steady_ids = [r.id for r, v in [*empty, *later] if len(v) < 2]
        result.before_ms, result.after_ms = center, med_b
        step_delta = NOT_AVAILABLE
    sa, sb = a.summary, b.summary
    result.phase_shift = phase_shift(sa, sb, result.batch_sizes)
    # GPM's SM activity, shown where either run had it (a Hopper or later GPU), after NVML's
    # utilisation, which reads 100% while most SMs idle
    sm_row = _points_row(
        "SM activity", sa.sm_active_median_pct, sb.sm_active_median_pct, fmt_pct, GOOD
    )
    sm_measured = sa.sm_active_median_pct is not None or sb.sm_active_median_pct is not None
    mfu_row = _mfu_row(sa, sb)
    means = _means_of(len(medians_a), len(runs_b))
    step_row = ComparisonRow(
        "median step time" + means, fmt_ms(center), fmt_ms(med_b), step_delta, step_direction
    )
    if result.batch_sizes is not None and result.step_ratio is not None:
        # the verdict is the time per sample's; the step time only says how long a step got
        before_sample, after_sample = result.judged_ms()
        step_row = step_row._replace(direction=NEUTRAL)
        per_sample_row = ComparisonRow(
            "time per sample" + means,
            fmt_ms(before_sample),
            fmt_ms(after_sample),
            signed_pct(result.step_ratio - 1),
            step_direction,
        )
        step_rows = [per_sample_row, step_row]
    else:
        step_rows = [step_row]
    result.rows = [
        *step_rows,
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
        *([mfu_row] if sa.mfu is not None or sb.mfu is not None else []),
        *_phase_rows(sa, sb),
        _relative_row("peak GPU memory", sa.gpu_mem_peak_mb, sb.gpu_mem_peak_mb, fmt_mb, NEUTRAL),
        _verdict_row(a.diagnosis, b.diagnosis),
    ]
    return result


#: The phase rows of a comparison: label (as the comparison names the part) -> the phase.
PHASE_ROWS = {PART_NAMES.get(phase, phase): phase for phase in PHASES}


def _phase_rows(a: Summary, b: Summary) -> list[ComparisonRow]:
    """Which phase of the step moved: a row for each phase both runs timed (medians over
    their sampled steps, where it ran for a phase that ran in few of them; no direction of
    their own: the step time's verdict is the judgement, these say where it went)."""
    rows = []
    for label, part in PHASE_ROWS.items():
        before, after = part_ms(a, part), part_ms(b, part)
        if before is not None and after is not None:
            rows.append(_relative_row(label, before[0], after[0], fmt_ms, NEUTRAL))
    return rows
