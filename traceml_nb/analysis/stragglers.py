"""The ranks of a job, side by side: their figures, the job's throughput and the straggler.

Pure functions: :func:`find_straggler`, :func:`slowest_rank` and :func:`summarize_ranks` take
:class:`RankFigures` (plain numbers per rank); :func:`analyze_ranks` makes them from the ranks'
records with the same analysis as a single run (:func:`~.pipeline.analyze`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engine.capabilities import Capabilities
from ..engine.rank_record import RankRecord
from .findings import Summary
from .formatting import fmt_ms, fmt_share
from .pipeline import Analysis, analyze
from .thresholds import STRAGGLER_MIN_WAIT_MS, STRAGGLER_STEP_FACTOR, STRAGGLER_WAIT_SHARE_MARGIN
from .warmup import WarmupSpec

#: Why the time in collectives is not shown per rank.
COLLECTIVES_UNAVAILABLE = (
    "timing them needs a communication hook on the DistributedDataParallel model, and DDP "
    "takes one hook per model: one of ours would take the one your code may register"
)


@dataclass
class RankFigures:
    """One rank's figures: ``steps`` the training steps its loop made; ``step_ms_median`` and
    ``data_wait_ms_median`` milliseconds over its steady steps; ``data_wait_share`` the share
    0..1 of its step time spent in the DataLoader; ``samples_per_s`` its throughput; None where
    not measured. ``status`` as :class:`~traceml_nb.engine.record.RankRecord` has it; ``stored_id``
    the rank's run in the store (``@17``) when a ``torchrun`` rank stored it, else None."""

    rank: int
    status: str = "completed"
    error: str | None = None
    steps: int = 0
    step_ms_median: float | None = None
    data_wait_ms_median: float | None = None
    data_wait_share: float | None = None
    samples_per_s: float | None = None
    launch: int = 0
    pid: int | None = None
    stored_id: int | None = None

    @classmethod
    def of_summary(
        cls,
        rank: int,
        summary: Summary,
        status: str,
        error: str | None,
        *,
        launch: int = 0,
        pid: int | None = None,
    ) -> RankFigures:
        """The figures of a rank whose run's analysis is ``summary`` (unmeasured: None)."""

        def number(value: float | None) -> float | None:
            return None if value is None or math.isnan(value) else float(value)

        return cls(
            rank,
            status,
            error,
            int(summary.total_steps),
            number(summary.step_ms_median),
            number(summary.data_wait_ms_median),
            number(summary.data_wait_share),
            number(summary.samples_per_s),
            launch,
            pid,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RankFigures:
        """The figures :meth:`to_dict` gave (another rank's, received over the network);
        ``ValueError`` saying what is wrong with data that is not."""
        if not isinstance(data, dict):
            raise ValueError(f"a rank's figures are a dict, not {type(data).__name__}")

        def read(name: str, types: tuple[type, ...], required: bool = False) -> Any:
            value = data.get(name)
            if value is None and not required:
                return None
            if isinstance(value, bool) or not isinstance(value, types):
                raise ValueError(f"a rank's figures have {name}={value!r}")
            return value

        number = (int, float)
        return cls(
            rank=read("rank", (int,), True),
            status=read("status", (str,), True),
            error=read("error", (str,)),
            steps=read("steps", (int,), True),
            step_ms_median=read("step_ms_median", number),
            data_wait_ms_median=read("data_wait_ms_median", number),
            data_wait_share=read("data_wait_share", number),
            samples_per_s=read("samples_per_s", number),
            launch=read("launch", (int,)) or 0,
            pid=read("pid", (int,)),
            stored_id=read("stored_id", (int,)),
        )

    @property
    def label(self) -> str:
        return (
            f"rank {self.rank}" if not self.launch else f"launch {self.launch + 1} rank {self.rank}"
        )


@dataclass
class Straggler:
    """The rank that holds the others back: ``by`` "data wait" or "step time"."""

    rank: int
    by: str
    evidence: str
    launch: int = 0


@dataclass
class RanksSummary:
    """The ranks of the run: their figures in rank order, the straggler (None: none stands
    out, or fewer than two ranks measured), ``samples_per_s`` the job's throughput (the sum of
    the ranks'; None when no rank measured it), ``collectives`` why the time in collectives
    is unavailable, ``failures`` one sentence per rank that did not complete, and
    ``reported`` the ``(launch, rank)`` whose summary and diagnosis the report shows."""

    ranks: list[RankFigures] = field(default_factory=list)
    straggler: Straggler | None = None
    samples_per_s: float | None = None
    collectives: str = COLLECTIVES_UNAVAILABLE
    failures: list[str] = field(default_factory=list)
    reported: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _others_median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def find_straggler(figures: Sequence[RankFigures]) -> Straggler | None:
    """The straggler of one launch's ranks, or None.

    A rank is the straggler by its data wait when its data wait share exceeds the median of
    the other ranks' shares by ``STRAGGLER_WAIT_SHARE_MARGIN`` and its median wait theirs by
    ``STRAGGLER_MIN_WAIT_MS``; else by its step time when its median step is at least
    ``STRAGGLER_STEP_FACTOR`` times the others'. Of several, the one furthest past its margin.
    """
    measured = [f for f in figures if f.step_ms_median is not None]
    if len(measured) < 2:
        return None
    best: tuple[float, Straggler] | None = None
    for f in measured:
        others = [o for o in measured if o is not f]
        share = _others_median([o.data_wait_share for o in others])
        wait = _others_median([o.data_wait_ms_median for o in others])
        step = _others_median([o.step_ms_median for o in others])
        assert f.step_ms_median is not None and step is not None
        if (
            f.data_wait_share is not None
            and f.data_wait_ms_median is not None
            and share is not None
            and wait is not None
            and f.data_wait_share - share >= STRAGGLER_WAIT_SHARE_MARGIN
            and f.data_wait_ms_median - wait >= STRAGGLER_MIN_WAIT_MS
        ):
            excess = (f.data_wait_share - share) / STRAGGLER_WAIT_SHARE_MARGIN
            found = Straggler(f.rank, "data wait", _wait_evidence(f, share, wait, step), f.launch)
        elif f.step_ms_median >= step * STRAGGLER_STEP_FACTOR:
            excess = f.step_ms_median / (step * STRAGGLER_STEP_FACTOR)
            found = Straggler(f.rank, "step time", _step_evidence(f, step), f.launch)
        else:
            continue
        if best is None or excess > best[0]:
            best = (excess, found)
    return best[1] if best else None


def slowest_rank(
    figures: Sequence[RankFigures], tie_share: float = 0.0
) -> tuple[RankFigures, bool] | None:
    """The rank a launch or job is judged by, and whether it is the straggler: the straggler
    when one stands out (:func:`find_straggler`: DDP ranks all take the straggler's step time,
    so its data wait tells it apart), else the rank with the longest median step. Ranks whose
    medians are within ``tie_share`` (0..1) of the longest are tied, and the tie goes to the
    larger data wait share, then to the lowest rank. None before any rank has a median."""
    measured = [f for f in figures if f.step_ms_median is not None]
    if not measured:
        return None
    found = find_straggler(measured)
    if found is not None:
        return next(f for f in measured if (f.launch, f.rank) == (found.launch, found.rank)), True
    longest = max(f.step_ms_median or 0.0 for f in measured)
    tied = [f for f in measured if (f.step_ms_median or 0.0) >= longest * (1 - tie_share)]
    share = [-1.0 if f.data_wait_share is None else f.data_wait_share for f in tied]
    return tied[max(range(len(tied)), key=lambda i: (share[i], -tied[i].rank))], False


def _wait_evidence(f: RankFigures, share: float, wait: float, step: float) -> str:
    assert f.data_wait_share is not None and f.data_wait_ms_median is not None
    assert f.step_ms_median is not None
    text = (
        f"{f.label} waits for data {fmt_share(f.data_wait_share)} of its step time "
        f"({fmt_ms(f.data_wait_ms_median)} a step; the other ranks {fmt_share(share)}, "
        f"{fmt_ms(wait)})"
    )
    if step * STRAGGLER_STEP_FACTOR > f.step_ms_median:  # the others' steps are as long
        return text + (
            f"; the other ranks spend that time waiting for {f.label} at the gradient all-reduce"
        )
    return text + f"; the other ranks' steps are shorter ({fmt_ms(step)}): they do not wait for it"


def _step_evidence(f: RankFigures, step: float) -> str:
    assert f.step_ms_median is not None
    return (
        f"{f.label}'s median step takes {fmt_ms(f.step_ms_median)}, the other ranks' "
        f"{fmt_ms(step)} ({f.step_ms_median / step:.1f}x)"
    )


def summarize_ranks(figures: Sequence[RankFigures]) -> RanksSummary:
    """The ranks side by side: the straggler of the last launch, the job's throughput (the sum
    over that launch's ranks), the ranks that failed, and whose report the run's is (the
    straggler, else the lowest rank that measured steps)."""
    ordered = sorted(figures, key=lambda f: (f.launch, f.rank))
    last = [f for f in ordered if f.launch == ordered[-1].launch] if ordered else []
    straggler = find_straggler(last)
    rates = [f.samples_per_s for f in last if f.samples_per_s is not None]
    failures = []
    for f in ordered:
        if f.status == "failed":
            failures.append(f"{f.label} failed: {f.error or 'an exception'}")
        elif f.status == "interrupted":
            failures.append(f"{f.label} was interrupted")
        elif f.status in ("lost", "running"):
            failures.append(
                f"{f.label} ended without its last rows (stopped by its launcher, or killed); "
                f"its {f.steps:,} steps until then are kept"
            )
    reported = (
        (straggler.launch, straggler.rank)
        if straggler
        else next(((f.launch, f.rank) for f in last if f.steps), None)
    )
    return RanksSummary(
        ranks=ordered,
        straggler=straggler,
        samples_per_s=sum(rates) if rates else None,
        failures=failures,
        reported=reported,
    )


def analyze_ranks(
    ranks: Sequence[RankRecord], warmup: WarmupSpec = "auto"
) -> tuple[RanksSummary, dict[tuple[int, int], Analysis]]:
    """Every rank's record analysed as a run of its own, and the ranks side by side; the
    analyses by ``(launch, rank)``."""
    analyses: dict[tuple[int, int], Analysis] = {}
    figures = []
    for rec in ranks:
        caps = Capabilities()
        caps.set("steps", True)
        caps.set("data_wait", True)
        for name in ("nvml", "gpu_utilisation", "host", "gpu_events", "gpu_memory"):
            caps.set(name, False, "not measured in the ranks")
        analysis = analyze(rec.record.snapshot(), caps, warmup=warmup)
        analyses[(rec.launch, rec.rank)] = analysis
        s = analysis.summary
        figures.append(
            RankFigures.of_summary(
                rec.rank, s, rec.status, rec.error, launch=rec.launch, pid=rec.pid
            )
        )
    return summarize_ranks(figures), analyses
