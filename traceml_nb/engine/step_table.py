"""The step table of a run record (:mod:`traceml_nb.engine.record`): one row per step, written by
the training thread (or whichever thread processes its log), read by any thread through
:meth:`StepTable.snapshot`, which copies the rows present at that moment.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

NAN = float("nan")

#: The phase columns of a step row, in this order (see :class:`StepTable`); the rest of a step
#: (its ``wall_ns`` less its wait and these) is the loop's own: zero_grad, logging, and so on.
PHASE_COLUMNS = ("copy_ns", "forward_ns", "backward_ns", "optimizer_ns")
PHASE_WIDTH = len(PHASE_COLUMNS)
#: The same phases on the GPU timeline (CUDA events), in the same order.
GPU_PHASE_COLUMNS = ("gpu_copy_ms", "gpu_forward_ms", "gpu_backward_ms", "gpu_optimizer_ms")


def pack_meta(batch: int, source: int, flags: int) -> int:
    """A row's batch size, source and flags as one int64: ``batch << 16 | source << 8 | flags``
    (``batch`` -1 stays negative, so it unpacks as -1)."""
    return (batch << 16) | (source << 8) | flags


class StepTable:
    """One row per step: 32 bytes a row, plus 8 when GPU figures are filled in, 8 more where
    the batches' elements were read.

    Columns (all times are nanoseconds of ``time.perf_counter_ns`` relative to the run start,
    GPU figures are milliseconds on the GPU timeline, ``NaN`` while pending or unavailable):

    ``start_ns``  when the step began (the loader's ``__next__`` was entered)
    ``wall_ns``   step duration: this batch's fetch plus everything until the next fetch
    ``wait_ns``   host time spent inside the loader's ``__next__`` (data wait)
    ``batch``     samples in the batch, counted from the loader's ``BatchSampler`` where that
                  is exact, else read from the batch; -1 when unknown
    ``elements``  elements of the batch's first tensor, where its size was read (a custom
                  collate: batches padded to their longest sequence), else -1
    ``gpu_stall_ms`` time the GPU sat idle waiting for this batch (CUDA events)
    ``gpu_span_ms``  time on the GPU timeline from the batch's arrival to the next fetch
    ``source``    loader slot (0..249) or ``SOURCE_MARKER`` / ``SOURCE_OPTIMIZER``
    ``flags``     ``FLAG_*`` bits
    ``copy_ns``   host time from the batch's arrival to the model's first forward after it
                  (the input copy, and whatever the loop did to the batch)
    ``forward_ns`` ``backward_ns`` ``optimizer_ns``  host time inside the model's forward, the
                  autograd backward and the optimizer's ``step()``
                  (:mod:`traceml_nb.engine.instrument.step_phases`); ``NaN`` in a row
                  without phases (a step that was not sampled, a row of a rank on a GPU)
    ``gpu_copy_ms`` ... ``gpu_optimizer_ms``  the same phases on the GPU timeline, ms (CUDA
                  events at their boundaries; the copy from the batch's arrival to the first
                  forward's start); ``NaN`` in a row without them (off CUDA, not sampled,
                  pending)

    Rows are four int64 in a single array (start, wall, wait, and :func:`pack_meta` of batch,
    source and flags), written whole; the GPU columns and ``elements`` are separate arrays that
    grow only when a value is set; the phases, kept for the few rows that have them, are two more arrays each
    (the rows' indices, ascending, and :data:`PHASE_WIDTH` values each), written before their
    rows and each index after its values. Readers get plain typed columns from
    :meth:`snapshot`, and the phases as :class:`PhaseRows`.
    """

    #: The columns a snapshot holds a value of for every row, and their ``array`` typecodes;
    #: the phases come as :class:`PhaseRows`, for the rows that have them.
    COLUMNS = (
        "start_ns",
        "wall_ns",
        "wait_ns",
        "batch",
        "elements",
        "gpu_stall_ms",
        "gpu_span_ms",
        "source",
        "flags",
    )
    TYPECODES = ("q", "q", "q", "i", "q", "f", "f", "B", "B")
    WIDTH = 4  #: int64 slots per row in the packed array

    def __init__(self) -> None:
        self._rows = array("q")
        self._gpu_stall = array("f")
        self._gpu_span = array("f")
        self._elements = array("q")  #: as far as the last row that has them, -1 in between
        self._phase_rows = array("q")  #: indices of the rows that have phases, ascending
        self._phase_values = array("q")  #: their PHASE_COLUMNS, PHASE_WIDTH a row
        self._gpu_phase_rows = array("q")  #: indices of the rows that have GPU phases, ascending
        self._gpu_phase_values = array("d")  #: their GPU_PHASE_COLUMNS, PHASE_WIDTH a row

    def append(
        self, start_ns: int, wall_ns: int, wait_ns: int, batch: int, source: int, flags: int
    ) -> int:
        """Append one step (GPU columns pending) and return its row index."""
        rows = self._rows
        rows.extend((start_ns, wall_ns, wait_ns, pack_meta(batch, source, flags)))
        return (len(rows) >> 2) - 1

    def extend(
        self,
        rows: Iterable[tuple[int, int, int, int, int, int]],
        phases: Sequence[tuple[int, int, int, int] | None] = (),
        elements: Sequence[int] = (),
    ) -> None:
        """Append many steps ``(start_ns, wall_ns, wait_ns, batch, source, flags)`` in one atomic
        ``extend``: a reader sees all of them or none. ``phases``, where given, holds each row's
        ``PHASE_COLUMNS`` (None: the row has none); ``elements``, each row's (-1: none told)."""
        packed: list[int] = []
        for start_ns, wall_ns, wait_ns, batch, source, flags in rows:
            packed += (start_ns, wall_ns, wait_ns, pack_meta(batch, source, flags))
        first = len(self)
        for i, p in enumerate(phases):
            if p is not None:
                self._phase_values.extend(p)
                self._phase_rows.append(first + i)
        if elements and max(elements) >= 0:
            column = self._elements
            missing = first - len(column)
            if missing > 0:
                column.extend(_unknown(missing))
            column.extend(array("q", elements))
        self._rows.extend(packed)

    def set_gpu(self, row: int, stall_ms: float, span_ms: float) -> None:
        """Fill in the GPU figures of ``row`` (resolved later than the row was written; NaN
        for the rows before it that were not). The two columns grow together."""
        stall, span = self._gpu_stall, self._gpu_span
        missing = row - len(stall)
        if missing > 0:  # rows resolve in order, mostly one after the other
            stall.extend(_nans(missing))
            span.extend(_nans(missing))
        if missing >= 0:
            stall.append(stall_ms)
            span.append(span_ms)
        else:
            stall[row] = stall_ms
            span[row] = span_ms

    def set_gpu_phases(self, row: int, phases_ms: Sequence[float]) -> None:
        """Fill in the GPU phases of ``row`` (``GPU_PHASE_COLUMNS``, ms; NaN for a phase it has
        not): rows are resolved in order, so each row comes after the last one set."""
        rows = self._gpu_phase_rows
        if rows and row <= rows[-1]:
            return
        self._gpu_phase_values.extend(phases_ms)
        rows.append(row)

    def __len__(self) -> int:
        return len(self._rows) >> 2

    @property
    def nbytes(self) -> int:
        """Memory held by the columns' buffers, in bytes."""
        return sum(
            col.buffer_info()[1] * col.itemsize
            for col in (
                self._rows,
                self._gpu_stall,
                self._gpu_span,
                self._elements,
                self._phase_rows,
                self._phase_values,
                self._gpu_phase_rows,
                self._gpu_phase_values,
            )
        )

    def snapshot(self, start: int = 0) -> StepColumns:
        """Copy rows ``start..`` as they are now; safe to call from any thread."""
        import numpy as np

        packed = self._rows[start * 4 :]  # one atomic copy; a row is written by one extend
        n = len(packed) >> 2
        packed = packed[: n * 4]
        meta = np.frombuffer(packed[3::4], dtype=np.int64) if n else np.zeros(0, np.int64)
        return StepColumns(
            start,
            packed[0::4],
            packed[1::4],
            packed[2::4],
            _typed("i", (meta >> 16).astype(np.int32)),
            self._elements_column(start, n),
            self._gpu_column(self._gpu_stall, start, n),
            self._gpu_column(self._gpu_span, start, n),
            _typed("B", ((meta >> 8) & 0xFF).astype(np.uint8)),
            _typed("B", (meta & 0xFF).astype(np.uint8)),
            _phase_rows(self._phase_rows, self._phase_values, np.int64, start, n),
            _phase_rows(self._gpu_phase_rows, self._gpu_phase_values, np.float64, start, n),
        )

    @staticmethod
    def _gpu_column(col: array, start: int, n: int) -> array:
        out = col[start : start + n]
        if len(out) < n:
            out.extend(_nans(n - len(out)))
        return out

    def _elements_column(self, start: int, n: int) -> array:
        out = self._elements[start : start + n]
        if len(out) < n:
            out.extend(_unknown(n - len(out)))
        return out

    # whole columns, for readers that want one (each call copies: use snapshot() for several)
    @property
    def start_ns(self) -> array:
        return self.snapshot().start_ns

    @property
    def wall_ns(self) -> array:
        return self.snapshot().wall_ns

    @property
    def wait_ns(self) -> array:
        return self.snapshot().wait_ns

    @property
    def batch(self) -> array:
        return self.snapshot().batch

    @property
    def elements(self) -> array:
        return self._elements_column(0, len(self))

    @property
    def gpu_stall_ms(self) -> array:
        return self._gpu_column(self._gpu_stall, 0, len(self))

    @property
    def gpu_span_ms(self) -> array:
        return self._gpu_column(self._gpu_span, 0, len(self))

    @property
    def source(self) -> array:
        return self.snapshot().source

    @property
    def flags(self) -> array:
        return self.snapshot().flags

    @property
    def phases(self) -> PhaseRows:
        return self.snapshot().phases

    @property
    def gpu_phases(self) -> PhaseRows:
        return self.snapshot().gpu_phases


def _phase_rows(rows_col: array, values_col: array, dtype: Any, start: int, n: int) -> PhaseRows:
    """The :class:`PhaseRows` of rows ``start..start+n`` of the :data:`PHASE_WIDTH` columns
    kept for the rows listed in ``rows_col`` (ascending; their values ``PHASE_WIDTH`` a row in
    ``values_col``, of numpy ``dtype``)."""
    import numpy as np

    rows = rows_col[:]  # one atomic copy; each index is written after its values
    lo, hi = bisect_left(rows, start), bisect_left(rows, start + n)
    if hi == lo:  # none (the GPU phases off CUDA, rows between samples)
        return PhaseRows.none()
    kept = values_col[lo * PHASE_WIDTH : hi * PHASE_WIDTH]
    values = np.frombuffer(kept, dtype).reshape(hi - lo, PHASE_WIDTH).astype(np.float64)
    return PhaseRows(np.frombuffer(rows[lo:hi], np.int64) - start, values)


def _typed(code: str, values: np.ndarray) -> array:
    out = array(code)
    out.frombytes(values.tobytes())
    return out


@dataclass(frozen=True)
class PhaseRows:
    """The phases of the rows of a range of steps that have them, kept apart from the columns
    every row has: the sampled steps, one in tens or thousands in a training loop (every step
    only in a loop without an optimizer, where the instruments stay on).

    ``index``: each such row's position in the range (int64, ascending); ``values``: its
    :data:`PHASE_WIDTH` phases a row (float64: host ns, or GPU ms with ``NaN`` for a phase it
    has not)."""

    index: np.ndarray
    values: np.ndarray

    @classmethod
    def none(cls) -> PhaseRows:
        import numpy as np

        return cls(np.zeros(0, np.int64), np.zeros((0, PHASE_WIDTH)))

    @classmethod
    def of_dense(cls, values: Any) -> PhaseRows:
        """The rows of an ``(n, PHASE_WIDTH)`` array that are not all ``NaN``."""
        import numpy as np

        dense = np.asarray(values, np.float64).reshape(-1, PHASE_WIDTH)
        index = np.flatnonzero(~np.isnan(dense).all(axis=1))
        return cls(index, dense[index])

    def __len__(self) -> int:
        return len(self.index)

    def dense(self, n: int) -> np.ndarray:
        """The phases of all ``n`` rows of the range, ``(n, PHASE_WIDTH)``, ``NaN`` in a row
        without them: a dense copy, for a check that reads them row by row."""
        import numpy as np

        out = np.full((n, PHASE_WIDTH), np.nan)
        out[self.index] = self.values
        return out

    def window(self, lo: int, hi: int) -> PhaseRows:
        """The rows at positions ``lo..hi`` (``hi`` excluded), their positions counted from
        ``lo``."""
        first, last = self.index.searchsorted(lo), self.index.searchsorted(hi)
        return PhaseRows(self.index[first:last] - lo, self.values[first:last])

    def take(self, positions: np.ndarray) -> PhaseRows:
        """The rows at ``positions`` (ascending positions in this range, as from
        ``np.flatnonzero(mask)``), each at its place in ``positions``."""
        import numpy as np

        if not len(self) or not len(positions):
            return PhaseRows.none()
        at = np.searchsorted(positions, self.index)
        found = at < len(positions)
        found[found] = positions[at[found]] == self.index[found]
        return PhaseRows(at[found], self.values[found])


@dataclass
class StepColumns:
    """An immutable copy of a range of :class:`StepTable` rows (see there for the units): the
    columns of :attr:`StepTable.COLUMNS`, a value a row, and the host and GPU phases of the
    rows that have them (``phases``, ``gpu_phases``: positions in the range)."""

    offset: int
    start_ns: array
    wall_ns: array
    wait_ns: array
    batch: array
    elements: array
    gpu_stall_ms: array
    gpu_span_ms: array
    source: array
    flags: array
    phases: PhaseRows
    gpu_phases: PhaseRows

    def __len__(self) -> int:
        return len(self.flags)

    def tail(self, start: int) -> StepColumns:
        """The rows from row ``start`` of the table on (``start`` counts from the table's first
        row, as :attr:`offset` does)."""
        return self.window(max(0, start - self.offset), len(self))

    def window(self, lo: int, hi: int) -> StepColumns:
        """Rows ``lo..hi`` of these (``hi`` excluded; positions in these, not the table's)."""
        columns: dict[str, Any] = {name: getattr(self, name)[lo:hi] for name in StepTable.COLUMNS}
        return StepColumns(
            self.offset + lo,
            **columns,
            phases=self.phases.window(lo, hi),
            gpu_phases=self.gpu_phases.window(lo, hi),
        )

    def phase_column(self, name: str) -> array:
        """One phase of every row (a name of :data:`PHASE_COLUMNS` or
        :data:`GPU_PHASE_COLUMNS`), ``NaN`` where a row has none: a dense copy, for a check
        that reads a column; the analysis reads :attr:`phases` as they are."""
        gpu = name in GPU_PHASE_COLUMNS
        names = GPU_PHASE_COLUMNS if gpu else PHASE_COLUMNS
        rows = self.gpu_phases if gpu else self.phases
        return _typed("d", rows.dense(len(self))[:, names.index(name)].copy())


def _unknown(n: int) -> array:
    """``n`` -1s of the ``elements`` column."""
    return array("q", [-1]) * n


def _nans(n: int) -> array:
    """``n`` NaNs of a GPU column (``array("f")``), made in one go: a CPU run's columns are
    all NaN, and a list of them converted item by item took half of a snapshot's time."""
    return array("f", [NAN]) * n
