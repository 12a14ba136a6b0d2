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
    """One row per step: 32 bytes a row, plus 8 when GPU figures are filled in.

    Columns (all times are nanoseconds of ``time.perf_counter_ns`` relative to the run start,
    GPU figures are milliseconds on the GPU timeline, ``NaN`` while pending or unavailable):

    ``start_ns``  when the step began (the loader's ``__next__`` was entered)
    ``wall_ns``   step duration: this batch's fetch plus everything until the next fetch
    ``wait_ns``   host time spent inside the loader's ``__next__`` (data wait)
    ``batch``     samples in the batch, counted from the loader's ``BatchSampler`` where that
                  is exact, else read from the batch; -1 when unknown
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
    source and flags), written whole; the GPU columns are separate arrays that grow only when a
    GPU value is set; the phases, kept for the few rows that have them, are two more arrays each
    (the rows' indices, ascending, and :data:`PHASE_WIDTH` values each), written before their
    rows and each index after its values. Readers get plain typed columns from
    :meth:`snapshot`.
    """

    COLUMNS = (
        "start_ns",
        "wall_ns",
        "wait_ns",
        "batch",
        "gpu_stall_ms",
        "gpu_span_ms",
        "source",
        "flags",
        *PHASE_COLUMNS,
        *GPU_PHASE_COLUMNS,
    )
    TYPECODES = ("q", "q", "q", "i", "f", "f", "B", "B", *"dddd", *"dddd")
    WIDTH = 4  #: int64 slots per row in the packed array

    def __init__(self) -> None:
        self._rows = array("q")
        self._gpu_stall = array("f")
        self._gpu_span = array("f")
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
    ) -> None:
        """Append many steps ``(start_ns, wall_ns, wait_ns, batch, source, flags)`` in one atomic
        ``extend``: a reader sees all of them or none. ``phases``, where given, holds each row's
        ``PHASE_COLUMNS`` (None: the row has none)."""
        packed: list[int] = []
        for start_ns, wall_ns, wait_ns, batch, source, flags in rows:
            packed += (start_ns, wall_ns, wait_ns, pack_meta(batch, source, flags))
        first = len(self)
        for i, p in enumerate(phases):
            if p is not None:
                self._phase_values.extend(p)
                self._phase_rows.append(first + i)
        self._rows.extend(packed)

    def set_gpu(self, row: int, stall_ms: float, span_ms: float) -> None:
        """Fill in the GPU figures of ``row`` (resolved later than the row was written)."""
        for col, value in ((self._gpu_stall, stall_ms), (self._gpu_span, span_ms)):
            missing = row + 1 - len(col)
            if missing > 0:
                col.extend([NAN] * missing)
            col[row] = value

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
            self._gpu_column(self._gpu_stall, start, n),
            self._gpu_column(self._gpu_span, start, n),
            _typed("B", ((meta >> 8) & 0xFF).astype(np.uint8)),
            _typed("B", (meta & 0xFF).astype(np.uint8)),
            *_sparse_columns(self._phase_rows, self._phase_values, np.int64, start, n),
            *_sparse_columns(self._gpu_phase_rows, self._gpu_phase_values, np.float64, start, n),
        )

    @staticmethod
    def _gpu_column(col: array, start: int, n: int) -> array:
        out = col[start : start + n]
        if len(out) < n:
            out.extend([NAN] * (n - len(out)))
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
    def copy_ns(self) -> array:
        return self.snapshot().copy_ns

    @property
    def forward_ns(self) -> array:
        return self.snapshot().forward_ns

    @property
    def backward_ns(self) -> array:
        return self.snapshot().backward_ns

    @property
    def optimizer_ns(self) -> array:
        return self.snapshot().optimizer_ns

    @property
    def gpu_copy_ms(self) -> array:
        return self.snapshot().gpu_copy_ms

    @property
    def gpu_forward_ms(self) -> array:
        return self.snapshot().gpu_forward_ms

    @property
    def gpu_backward_ms(self) -> array:
        return self.snapshot().gpu_backward_ms

    @property
    def gpu_optimizer_ms(self) -> array:
        return self.snapshot().gpu_optimizer_ms


def _sparse_columns(
    rows_col: array, values_col: array, dtype: Any, start: int, n: int
) -> list[array]:
    """Rows ``start..start+n`` of the :data:`PHASE_WIDTH` columns kept for the rows listed in
    ``rows_col`` (ascending; their values ``PHASE_WIDTH`` a row in ``values_col``, of numpy
    ``dtype``), as float columns, ``NaN`` where a row has none."""
    import numpy as np

    rows = rows_col[:]  # one atomic copy; each index is written after its values
    lo, hi = bisect_left(rows, start), bisect_left(rows, start + n)
    if hi == lo:  # none (the GPU phases off CUDA, rows between samples): NaN, made cheaply
        return [array("d", [NAN]) * n for _ in range(PHASE_WIDTH)]
    values = np.full((n, PHASE_WIDTH), np.nan)
    kept = values_col[lo * PHASE_WIDTH : hi * PHASE_WIDTH]
    known: np.ndarray = np.frombuffer(kept, dtype).reshape(hi - lo, PHASE_WIDTH)
    values[np.frombuffer(rows[lo:hi], np.int64) - start] = known
    return [_typed("d", np.ascontiguousarray(values[:, i])) for i in range(PHASE_WIDTH)]


def _typed(code: str, values: np.ndarray) -> array:
    out = array(code)
    out.frombytes(values.tobytes())
    return out


@dataclass
class StepColumns:
    """An immutable copy of a range of :class:`StepTable` rows (see there for the units)."""

    offset: int
    start_ns: array
    wall_ns: array
    wait_ns: array
    batch: array
    gpu_stall_ms: array
    gpu_span_ms: array
    source: array
    flags: array
    copy_ns: array
    forward_ns: array
    backward_ns: array
    optimizer_ns: array
    gpu_copy_ms: array
    gpu_forward_ms: array
    gpu_backward_ms: array
    gpu_optimizer_ms: array

    def __len__(self) -> int:
        return len(self.flags)

    def tail(self, start: int) -> StepColumns:
        """The rows from row ``start`` of the table on (``start`` counts from the table's first
        row, as :attr:`offset` does)."""
        skip = max(0, start - self.offset)
        return StepColumns(
            self.offset + skip,
            *(getattr(self, name)[skip:] for name in StepTable.COLUMNS),
        )
