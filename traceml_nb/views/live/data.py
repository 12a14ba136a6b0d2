"""Chart data for the live view: record snapshots in, batched and downsampled points out (the
step chart's here, the sample charts' in :mod:`.sample_series`).

Pure logic, no Bokeh: the live view asks a series for its update once per tick and sends the
result as one ``stream`` (``replace=False``: append the points) or one data replacement
(``replace=True``). A series never holds more than ``max_points`` points, however long the
run: rows are grouped into buckets of ``k`` rows (``k`` a power of two, the median of each
column per bucket) and when the run outgrows ``max_points * k`` rows, ``k`` doubles and the
whole series is re-binned from the record (a replacement; it happens about
``log2(rows / max_points)`` times in a run, so ~6 times in a 100,000-step run).

Only complete buckets are sent while the run is live; the last, partial bucket is sent by
the final update. Values that were not measured stay ``NaN`` (a gap in the chart, never 0).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...analysis.steps import StepRule, rule_of
from ...engine.record import RecordSnapshot
from ...engine.step_table import PHASE_COLUMNS, PhaseRows, StepColumns

NAN = float("nan")

#: Points a chart source keeps at most (the browser stays responsive well above this).
MAX_POINTS = 2000

#: The live figures of a run or a rank (its median step, its data wait share) are over its
#: latest this-many steps: recent enough to follow a loop that slows down, enough steps for a
#: median that one slow batch does not move.
RECENT_STEPS = 50

#: The throughput is averaged over at least this many steps (one step alone is too noisy).
RATE_WINDOW_STEPS = 20

#: The phases of a step the chart stacks, as ms columns (the record's ``PHASE_COLUMNS``).
PHASE_FIELDS = ("copy_ms", "forward_ms", "backward_ms", "optimizer_ms")

#: Columns of the step series. ``step``: 1-based step number (bucket middle); ``t_s``: seconds
#: from the run start to the end of the bucket; ``wait_ms``/``compute_ms``/``step_ms``: median
#: data wait, rest of the step, and whole step, in milliseconds; ``samples_per_s`` and
#: ``steps_per_s``: throughput over the last ``max(k, RATE_WINDOW_STEPS)`` steps up to the
#: bucket's end (``samples_per_s`` is NaN when a batch size there could not be read).
#: ``copy_ms`` .. ``optimizer_ms`` and ``other_ms``: the median of each step's rest split by the
#: phases of the latest step whose phases were timed (they are timed on a sample of the steps:
#: :mod:`~traceml_nb.engine.instrument.step_phases`), NaN before the first such step;
#: ``other_ms`` is the rest less those phases, and the whole rest where none is known yet.
STEP_FIELDS = (
    "step",
    "t_s",
    "wait_ms",
    "compute_ms",
    "step_ms",
    "samples_per_s",
    "steps_per_s",
    *PHASE_FIELDS,
    "other_ms",
)


Columns = dict[str, np.ndarray]


@dataclass
class SeriesUpdate:
    """What one chart source must receive this tick (float64 columns of equal length)."""

    data: Columns
    replace: bool  #: True: the source's data becomes ``data``; False: ``data`` is appended

    def __len__(self) -> int:
        return len(next(iter(self.data.values()), ()))


def bucket_size(rows: int, max_points: int = MAX_POINTS) -> int:
    """Smallest power of two ``k`` such that ``rows`` rows make at most ``max_points`` buckets."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    k = 1
    while (rows + k - 1) // k > max_points:
        k *= 2
    return k


def bucket_medians(values: np.ndarray, k: int, *, partial: bool) -> np.ndarray:
    """Median of each run of ``k`` values (``NaN`` ignored; ``NaN`` where none was measured),
    along the last axis: ``values`` is one series, or several as rows (one call for all of
    them costs about what one series does).

    Only whole buckets unless ``partial``, which makes the remainder a last, shorter bucket.
    """
    values = np.asarray(values, dtype=np.float64)
    lead = values.shape[:-1]
    n = values.shape[-1]
    whole = n // k
    tail = n - whole * k if partial else 0
    out = np.full((*lead, whole + (1 if tail else 0)), NAN)
    if whole:
        grid = values[..., : whole * k].reshape(*lead, whole, k)
        head = out[..., :whole]  # (a view: written in place)
        if k == 1:
            head[...] = grid[..., 0]
        else:
            head[...] = np.median(grid, axis=-1)  # NaN where a bucket has a NaN...
            gaps = np.isnan(grid)
            partly = gaps.any(axis=-1) & ~gaps.all(axis=-1)
            if partly.any():  # ...so those are redone without their NaN (all-NaN stay NaN)
                head[partly] = np.nanmedian(grid[partly], axis=-1)
    if tail:
        for row in np.ndindex(*lead):  # (one series: the one row ())
            rest = values[row][whole * k :]
            rest = rest[~np.isnan(rest)]
            if len(rest):
                out[row][-1] = float(np.median(rest))
    return out


def recent_rate(history: Sequence[tuple[float, int]]) -> float | None:
    """Steps per second between the first and last ``(seconds, steps)`` of ``history``;
    ``None`` with fewer than two entries or no time between them."""
    if len(history) < 2:
        return None
    (t0, n0), (t1, n1) = history[0], history[-1]
    if t1 <= t0:
        return None
    return (n1 - n0) / (t1 - t0)


_NS = np.int64


@dataclass
class StepRows:
    """Rows of one step source, in order (times in nanoseconds, ``batch`` -1 when unknown).

    ``shares``: each row's phases (``PHASE_FIELDS``) as shares of its rest (wall less wait),
    those of the latest row at or before it whose phases were timed; NaN before the first
    (None: NaN throughout)."""

    start_ns: np.ndarray
    wall_ns: np.ndarray
    wait_ns: np.ndarray
    batch: np.ndarray
    shares: np.ndarray | None = None

    @classmethod
    def empty(cls) -> StepRows:
        return cls(*(np.empty(0, dtype=_NS) for _ in range(4)))

    @classmethod
    def of_rule(
        cls, cols: StepColumns, rule: StepRule, carry: np.ndarray | None = None
    ) -> StepRows:
        """The rows of ``cols`` that are steps by ``rule``; ``carry``: the phase shares in
        effect before the first (the last row's of the rows before; None: none known)."""
        keep = rule.mask(cols) if len(cols) else None

        def column(values: Any, dtype: Any = _NS) -> np.ndarray:
            if keep is None:
                return np.empty(0, dtype=dtype)
            return np.asarray(values, dtype=dtype)[keep]

        rows = cls(
            column(cols.start_ns), column(cols.wall_ns), column(cols.wait_ns), column(cols.batch)
        )
        if len(cols) and np.isfinite(np.asarray(cols.gpu_span_ms, np.float64)).any():
            # on a GPU: the proportions of the GPU timeline (the host's are kernel launches)
            timed, rest = cols.gpu_phases, column(cols.gpu_span_ms, np.float64)
        else:
            timed, rest = cols.phases, rows.wall_ns - rows.wait_ns
        if keep is not None:
            timed = timed.take(np.flatnonzero(keep))
        rows.shares = _carried_shares(timed, rest, carry)
        return rows

    def __len__(self) -> int:
        return len(self.wall_ns)

    def phase_shares(self) -> np.ndarray:
        """:attr:`shares`, an (n, 4) array (NaN where none is known)."""
        if self.shares is None:
            return np.full((len(self), len(PHASE_COLUMNS)), NAN)
        return self.shares

    def extend(self, other: StepRows) -> None:
        shares = np.concatenate([self.phase_shares(), other.phase_shares()])
        self.start_ns = np.concatenate([self.start_ns, other.start_ns])
        self.wall_ns = np.concatenate([self.wall_ns, other.wall_ns])
        self.wait_ns = np.concatenate([self.wait_ns, other.wait_ns])
        self.batch = np.concatenate([self.batch, other.batch])
        self.shares = shares

    def drop(self, n: int) -> None:
        """Forget the first ``n`` rows."""
        self.shares = self.phase_shares()[n:]
        self.start_ns = self.start_ns[n:]
        self.wall_ns = self.wall_ns[n:]
        self.wait_ns = self.wait_ns[n:]
        self.batch = self.batch[n:]


def _carried_shares(phases: PhaseRows, rest_ns: np.ndarray, carry: np.ndarray | None) -> np.ndarray:
    """Each row's phases (``phases``: those of the timed rows) as shares of its ``rest_ns``
    (the same unit), carried forward from the latest timed row (``carry`` before the first)."""
    n = len(rest_ns)
    out = np.full((n, len(PHASE_COLUMNS)), NAN)
    rows, values = phases.index, phases.values
    whole = ~np.isnan(values).any(axis=1) & (rest_ns[rows] > 0)
    rows, values = rows[whole], values[whole]
    out[rows] = np.clip(values / rest_ns[rows, None], 0.0, 1.0)
    timed = np.zeros(n, bool)
    timed[rows] = True
    # the index of the latest timed row at or before each row (-1: none yet)
    latest = np.maximum.accumulate(np.where(timed, np.arange(n), -1))
    filled = out[np.maximum(latest, 0)]
    filled[latest < 0] = NAN if carry is None else carry
    return filled


def empty_columns(names: Sequence[str]) -> Columns:
    return {name: np.empty(0) for name in names}


def bin_steps(
    rows: StepRows,
    first_step: int,
    k: int,
    *,
    partial: bool,
    context: int = 0,
    rate_window: int = RATE_WINDOW_STEPS,
) -> tuple[Columns, int]:
    """Bucket medians of ``rows[context:]`` (``k`` rows a bucket) and the number of rows used.

    ``first_step`` is the 0-based index of ``rows[context]`` within its source. Only whole
    buckets are used unless ``partial``, which also turns the remainder into a last point.
    The throughput of a point is measured over the last ``max(k, rate_window)`` steps up to
    the bucket's end; ``rows[:context]`` are earlier steps (already sent) that only serve that
    trailing window.
    """
    body = len(rows) - context
    used = body if partial else body - body % k
    if used <= 0:
        return empty_columns(STEP_FIELDS), 0
    seg = slice(context, context + used)
    wall_ms = rows.wall_ns[seg] / 1e6
    wait_ms = rows.wait_ns[seg] / 1e6
    lo = np.arange(0, used, k)
    hi = np.minimum(lo + k, used)
    last = context + hi - 1  # each bucket's last row, in ``rows``
    # throughput over the trailing window, from cumulative sums over all rows
    end = last + 1
    start = np.maximum(0, end - max(k, rate_window))
    walls = np.concatenate([[0], np.cumsum(rows.wall_ns)])
    samples = np.concatenate([[0], np.cumsum(np.maximum(rows.batch, 0))])
    unknown = np.concatenate([[0], np.cumsum(rows.batch < 0)])
    window_s = (walls[end] - walls[start]) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        steps_per_s = np.where(window_s > 0, (end - start) / window_s, NAN)
        samples_per_s = np.where(
            (window_s > 0) & (unknown[end] == unknown[start]),
            (samples[end] - samples[start]) / window_s,
            NAN,
        )
    rest_ms = wall_ms - wait_ms
    shares = rows.phase_shares()[seg]
    parts = shares * rest_ms[:, None]
    known = ~np.isnan(shares).any(axis=1)
    other_ms = np.where(known, rest_ms - np.nan_to_num(parts).sum(axis=1), rest_ms)
    medians = bucket_medians(
        np.vstack([wait_ms, rest_ms, wall_ms, parts.T, np.maximum(other_ms, 0.0)]),
        k,
        partial=partial,
    )
    data = {
        "step": first_step + (lo + hi + 1) / 2,  # middle of the bucket's steps, 1-based
        "t_s": (rows.start_ns[last] + rows.wall_ns[last]) / 1e9,
        "wait_ms": medians[0],
        "compute_ms": medians[1],
        "step_ms": medians[2],
        "samples_per_s": samples_per_s.astype(np.float64),
        "steps_per_s": steps_per_s.astype(np.float64),
        **{name: medians[3 + j] for j, name in enumerate(PHASE_FIELDS)},
        "other_ms": medians[3 + len(PHASE_FIELDS)],
    }
    return data, used


def bin_samples(cols: Mapping[str, np.ndarray], k: int, *, partial: bool) -> tuple[Columns, int]:
    """Bucket medians of every column of a sample snapshot (``k`` rows a bucket), rows used."""
    n = len(cols["t"])
    used = n if partial else n - n % k
    out = {name: bucket_medians(values[:used], k, partial=partial) for name, values in cols.items()}
    return out, used


#: Rows of the record a rebuild of the step series turns into steps at a time.
REBUILD_ROWS = 65_536

#: Reads the run's record: step rows from the given row on (``Run.snapshot``).
SnapshotReader = Callable[[int], RecordSnapshot]

#: A reader of the steps whose rule changed only by evaluations found once their epochs were
#: over (``StepRule.evaluations``), or rows found to have only fetched ahead
#: (``StepRule.fetched_ahead``), reads the whole record again once its last such reading's
#: CPU time is at most this share of the time since: a fast loop that evaluates over its
#: training loader after every epoch would have it bin every row at every tick (0.4 s at
#: 1,000,000 rows). Meanwhile it shows those batches as steps, as before their epochs were
#: over; a final update reads them right.
REREAD_MAX_DUTY = 0.004


class Rereads:
    """When a reader of the steps reads the whole record again for a changed rule
    (:data:`REREAD_MAX_DUTY`)."""

    def __init__(self) -> None:
        self.cost_s = 0.0  #: the CPU time of the last reading, s
        self.at = -math.inf  #: when it ended (``time.monotonic()``)

    def due(self, shown: StepRule | None, new: StepRule, final: bool) -> bool:
        """Whether a reader that shows the steps by ``shown`` (None: none yet) reads the whole
        record again now for ``new``: where the rule changed otherwise than by rows found since
        to be no steps (evaluations', rows that only fetched ahead), or in its ``final``
        update, at once."""
        if new == shown:
            return False
        if final or shown is None:
            return True
        found = replace(new, evaluations=shown.evaluations, fetched_ahead=shown.fetched_ahead)
        if found != shown:  # (not only rows found since)
            return True
        return time.monotonic() - self.at >= self.cost_s / REREAD_MAX_DUTY

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Times a reading of the whole record."""
        c0 = time.thread_time()
        try:
            yield
        finally:
            self.cost_s = time.thread_time() - c0
            self.at = time.monotonic()


class StepSeries:
    """The step chart's points for one run: its steps (:func:`~traceml_nb.analysis.steps.step_rule`),
    ≤ ``max_points`` buckets.

    Each update reads the rows added since the last one (``read(first_row)``); when the rule
    that picks the steps changes (the training loader becomes known, markers appear) the
    series is rebuilt from the whole record (for evaluations found since, when
    :class:`Rereads` says so). :attr:`snapshot` is what the last update read (its counters
    and loaders), :attr:`steps` the number of steps it holds.
    """

    def __init__(self, read: SnapshotReader, max_points: int = MAX_POINTS) -> None:
        self.read = read
        self.max_points = max_points
        self.rule: StepRule | None = None
        self.snapshot: RecordSnapshot | None = None
        self.k = 1  #: steps per point
        self.points = 0  #: points the chart holds after the updates handed out so far
        self.steps = 0  #: steps read so far
        self.finished = False
        self._rereads = Rereads()
        self._rows_read = 0  # rows of the step table read (all sources)
        self._binned = 0  # steps already in a sent point
        self._pending = StepRows.empty()  # steps read but not yet in a sent point, after...
        self._context = 0  # ...this many steps already sent, kept for the throughput window
        self._carry: np.ndarray | None = None  # the phase shares of the last step read
        #: a step's phases were timed and some took time: a model's (the chart splits the rest
        #: of the step; a loop without a model has phases of 0 throughout)
        self.has_phases = False
        #: the phases (``PHASE_FIELDS``) that took time in a timed step so far
        self.phases_seen: set[str] = set()

    def _keep_carry(self, rows: StepRows) -> None:
        shares = rows.phase_shares()
        if len(rows) and not np.isnan(shares[-1]).any():
            self._carry = shares[-1].copy()
        if len(rows) and np.nansum(shares, axis=1).max() > 0:  # a model was timed
            self.has_phases = True
            took_time = (np.nan_to_num(shares) > 0).any(axis=0)
            self.phases_seen.update(f for f, t in zip(PHASE_FIELDS, took_time, strict=True) if t)

    def update(
        self, *, final: bool = False, snapshot: RecordSnapshot | None = None
    ) -> SeriesUpdate | None:
        """The points to send now, or ``None`` when there is nothing new. ``snapshot``: a copy
        of the whole record read by the caller (rows from the first on), to use instead of
        reading again, so that the caller's other readings see the very rows the chart does."""
        if self.finished:
            return None
        self.finished = final
        if snapshot is not None:
            snap = replace(snapshot, steps=snapshot.steps.tail(self._rows_read))
        else:
            snap = self.read(self._rows_read)
        self.snapshot = snap
        rule = rule_of(snap)
        if rule.kind == "none":
            return None
        shown = self.rule
        if self._rereads.due(shown, rule, final):
            return self._rebuild(final, snapshot)
        if shown is not None:
            rule = shown  # (evaluations found since: read with the rule shown until then)
        self._rows_read += len(snap.steps)
        new = StepRows.of_rule(snap.steps, rule, self._carry)
        self._keep_carry(new)
        total = self._binned + len(self._pending) - self._context + len(new)
        if bucket_size(total, self.max_points) != self.k:
            return self._rebuild(final, snapshot)
        self._pending.extend(new)
        self.steps = total
        data = self._bin(final)
        if not len(data["step"]):
            return None
        self.points += len(data["step"])
        return SeriesUpdate(data, replace=False)

    def _rebuild(self, final: bool, snapshot: RecordSnapshot | None) -> SeriesUpdate:
        """All points again from the whole record (new rule or new bucket size), its rows
        binned :data:`REBUILD_ROWS` at a time as the updates bin theirs: a long run's rebuild
        holds the record's snapshot and one part's steps, not all its steps at once."""
        with self._rereads.reading():
            return self._rebuilt(final, snapshot)

    def _rebuilt(self, final: bool, snapshot: RecordSnapshot | None) -> SeriesUpdate:
        snap = snapshot if snapshot is not None else self.read(0)
        self.snapshot = snap
        self.rule = rule = rule_of(snap)
        cols = snap.steps
        self._rows_read = len(cols)
        self.steps = int(rule.mask(cols).sum()) if len(cols) else 0
        self.k = bucket_size(self.steps, self.max_points)
        self._carry = None
        self._pending = StepRows.empty()
        self._context = 0
        self._binned = 0
        parts = []
        for lo in range(0, max(1, len(cols)), REBUILD_ROWS):
            hi = lo + REBUILD_ROWS
            new = StepRows.of_rule(cols.window(lo, hi), rule, self._carry)
            self._keep_carry(new)
            self._pending.extend(new)
            parts.append(self._bin(final and hi >= len(cols)))
        data = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        self.points = len(data["step"])
        return SeriesUpdate(data, replace=True)

    def _bin(self, final: bool) -> Columns:
        """Points of the pending steps; keeps the last sent ones as the throughput's context."""
        data, used = bin_steps(
            self._pending, self._binned, self.k, partial=final, context=self._context
        )
        self._binned += used
        sent = self._context + used
        keep = min(sent, max(self.k, RATE_WINDOW_STEPS))
        self._pending.drop(sent - keep)
        self._context = keep
        return data
