"""The live charts' sample series: a sample table (host or one GPU) in, batched and downsampled
points out, as :mod:`.data` makes the step chart's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .data import MAX_POINTS, Columns, SeriesUpdate, bin_samples, bucket_size, empty_columns


class SampleTableLike(Protocol):
    """What a :class:`SampleSeries` reads: a :class:`~traceml_nb.engine.record.SampleTable`."""

    names: tuple[str, ...]

    def snapshot(self, start: int = 0) -> dict[str, Any]: ...

    def __len__(self) -> int: ...


class SampleSeries:
    """The points of one sample table (host or one GPU): ≤ ``max_points`` bucket medians.

    The table halves itself when it reaches its cap (its ``stride`` doubles, its rows are
    renumbered); the series notices and rebuilds.
    """

    def __init__(
        self,
        table: SampleTableLike,
        columns: Sequence[str] | None = None,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.table = table
        wanted = table.names[1:] if columns is None else columns
        #: the columns sent: the time ``t`` (seconds since the run start) and ``columns``
        self.names = ("t",) + tuple(c for c in wanted if c in table.names and c != "t")
        self.max_points = max_points
        self.k = 1  #: samples per point
        self.points = 0
        self.finished = False
        self._stride = getattr(table, "stride", 1)
        self._rows_read = 0
        self._binned = 0
        self._pending: Columns = empty_columns(self.names)
        self._started = False

    def update(self, *, final: bool = False) -> SeriesUpdate | None:
        """The points to send now, or ``None`` when there is nothing new."""
        if self.finished:
            return None
        self.finished = final
        stride = getattr(self.table, "stride", 1)
        if not self._started or stride != self._stride:
            self._started = True
            self._stride = stride
            return self._rebuild(final)
        snap = self._snapshot(self._rows_read)
        added = len(snap["t"])
        self._rows_read += added
        if bucket_size(self._binned + len(self._pending["t"]) + added, self.max_points) != self.k:
            return self._rebuild(final)
        for name, values in snap.items():
            self._pending[name] = np.concatenate([self._pending[name], values])
        return self._emit(final, replace=False)

    def _emit(self, final: bool, *, replace: bool) -> SeriesUpdate | None:
        data, used = bin_samples(self._pending, self.k, partial=final)
        self._pending = {name: values[used:] for name, values in self._pending.items()}
        self._binned += used
        had_points = self.points
        self.points = (0 if replace else self.points) + len(data["t"])
        if not len(data["t"]) and not (replace and had_points):
            return None
        return SeriesUpdate(data, replace=replace)

    def _rebuild(self, final: bool) -> SeriesUpdate | None:
        snap = self._snapshot(0)
        self._rows_read = len(snap["t"])
        self.k = bucket_size(self._rows_read, self.max_points)
        self._pending = snap
        self._binned = 0
        return self._emit(final, replace=True)

    def _snapshot(self, start: int) -> Columns:
        snap = self.table.snapshot(start)
        return {name: np.asarray(snap[name], dtype=np.float64) for name in self.names}
