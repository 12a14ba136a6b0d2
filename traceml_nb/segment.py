"""Step segmentation: the events the instruments logged (:mod:`traceml_nb.events`) into step rows.

Pure and torch-free: events in, rows and loader statistics written to the run record out.

* **A loader's steps.** Each DataLoader keeps its own steps, ``[entry of fetch k, entry of
  fetch k+1)``: the wait for batch k plus everything the loop did with it. The data wait of a
  step is the time inside ``__next__`` for its batch, plus the time inside any other loader's
  ``__next__`` while the step was open (loaders consumed together with ``zip(a, b)``, or a
  second loader drawn inside each step: its wait is part of the step's). The exhausting fetch
  (``StopIteration``) closes the epoch's last step; the end of the run closes the rest
  (``FLAG_TRUNCATED``), and a step closed so ends at its last optimizer step, if it had one.
* **Which loader trains.** An optimizer step is credited to the loader fetched last and to
  every loader fetched alongside it since the previous optimizer step (no more often than
  that one): their batches are followed by optimizer steps (``LoaderInfo.optimizer_steps``).
  The loader whose fetch comes first after an optimizer step begins the step
  (``LoaderInfo.leads``): the outer loop's loader, not one drawn inside the step.
  A step inside which a loader that no optimizer step followed was iterated (an evaluation)
  is flagged ``FLAG_INTERLEAVED``.
* **Without a DataLoader** the steps are the intervals between the first optimizer's
  ``step()`` calls (several optimizers, as in a GAN, make one step); these rows are written
  until a training loader is known. **Markers** (``traceml_nb.step()``) make rows of their own.

Which of these rows are *the* steps of the run is one rule, :func:`traceml_nb.analysis.steps.choose_steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .events import Event, Exhausted, Fetch, IteratorStarted, Marker, OptimizerStep
from .record import (
    FLAG_EPOCH_START,
    FLAG_INTERLEAVED,
    FLAG_OPTIMIZER_STEP,
    FLAG_TRUNCATED,
    MAX_LOADERS,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    LoaderInfo,
    RunRecord,
)

#: Receives ``(row, gpu_enter, gpu_exit, next_gpu_enter)`` for a step whose fetch carried CUDA
#: events, once the step is closed (its row written).
GpuSink = Callable[[int, Any, Any, Any], None]


class _Loader:
    """One loader's open step and counters."""

    __slots__ = (
        "slot",
        "info",
        "start",
        "wait",
        "batch",
        "flags",
        "inside",
        "last_optimizer_ns",
        "gpu_enter",
        "gpu_exit",
        "since_optimizer",
    )

    def __init__(self, slot: int, info: LoaderInfo) -> None:
        self.slot = slot
        self.info = info
        self.start = -1  #: entry of the open step's fetch, -1 while no step is open
        self.wait = 0
        self.batch = -1
        self.flags = 0
        self.inside: set[int] = set()  #: slots of the other loaders fetched inside the open step
        self.last_optimizer_ns = -1  #: the last optimizer step inside the open step
        self.gpu_enter: Any = None
        self.gpu_exit: Any = None
        self.since_optimizer = 0  #: fetches since the last optimizer step


class StepSegmenter:
    """Turns events into step rows of ``record`` (see the module docstring for the rules).

    Feed it the events in the order they were logged; :meth:`finish` closes what the run's end
    left open. Not thread-safe: its owner serialises the calls.
    """

    def __init__(self, record: RunRecord, gpu_sink: GpuSink | None = None) -> None:
        self.record = record
        self._t0 = record.t0_ns
        self._gpu_sink = gpu_sink
        self._loaders: dict[int, _Loader] = {}  #: by loader key
        self._by_slot: dict[int, _Loader] = {}
        self._iterators: dict[int, _Loader] = {}  #: by iterator id
        self._open: dict[int, _Loader] = {}  #: loaders with an open step, by slot
        self._current: _Loader | None = None  #: the loader fetched last
        self._after_optimizer = True  #: the next fetch begins a step
        self._training_known = False
        self._lead_optimizer: int | None = None
        self._optimizer_prev_ns = 0
        self._optimizer_wait_mark = 0
        self._marker_prev_ns = 0
        self._marker_wait_mark = 0
        self._wait_total = 0  #: data wait of every fetch so far, ns
        self._last_batch = -1
        self._rows: list[tuple[int, int, int, int, int, int]] = []
        self._gpu: list[tuple[int, Any, Any, Any]] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            Fetch: self._fetch,
            OptimizerStep: self._optimizer_step,
            IteratorStarted: self._iterator_started,
            Exhausted: self._exhausted,
            Marker: self._marker,
        }

    def feed(self, events: Iterable[Event]) -> None:
        """Apply ``events`` in order. The rows made are written even if an event raises (the
        events not reached stay in ``events``, an iterator, for the caller)."""
        handlers = self._handlers
        try:
            for event in events:
                handlers[type(event)](event)
        finally:
            self._flush()

    def finish(self, t_end_ns: int) -> None:
        """Close every open step at the run's end ``t_end_ns`` (``FLAG_TRUNCATED``)."""
        try:
            for st in list(self._open.values()):
                self._close(st, t_end_ns, None, truncated=True)
        finally:
            self._flush()

    # --- events ------------------------------------------------------------------------------
    def _iterator_started(self, ev: IteratorStarted) -> None:
        st = self._loaders.get(ev.loader)
        if st is None:
            slot = len(self.record.loaders)
            if ev.settings is None or slot >= MAX_LOADERS:
                self._iterators.pop(ev.iterator, None)
                return  # past MAX_LOADERS: counted nowhere rather than mislabelled
            ev.settings.slot = slot
            st = _Loader(slot, ev.settings)
            self.record.loaders.append(ev.settings)
            self._loaders[ev.loader] = st
            self._by_slot[slot] = st
        self._iterators[ev.iterator] = st

    def _fetch(self, ev: Fetch) -> None:
        st = self._iterators.get(ev.iterator)
        if st is None:
            return  # a loader past MAX_LOADERS
        if st.start >= 0:
            self._close(st, ev.t_enter_ns, ev.gpu_enter, truncated=False)
        wait = ev.t_exit_ns - ev.t_enter_ns
        info = st.info
        info.fetches += 1
        if info.fetches == 1:
            self.record.first_fetch_wait_ns[st.slot] = wait
        first = ev.number == 1
        if first:
            info.epochs += 1
        if self._after_optimizer:
            info.leads += 1
            self._after_optimizer = False
        for other in self._open.values():  # this wait is part of every step still open
            other.wait += wait
            other.inside.add(st.slot)
        st.since_optimizer += 1
        st.start = ev.t_enter_ns
        st.wait = wait
        st.batch = ev.batch
        st.flags = FLAG_EPOCH_START if first else 0
        st.gpu_enter, st.gpu_exit = ev.gpu_enter, ev.gpu_exit
        self._open[st.slot] = st
        self._current = st
        self._wait_total += wait
        self._last_batch = ev.batch

    def _exhausted(self, ev: Exhausted) -> None:
        st = self._iterators.pop(ev.iterator, None)
        if st is not None and st.start >= 0:
            self._close(st, ev.t_enter_ns, ev.gpu_enter, truncated=False)

    def _optimizer_step(self, ev: OptimizerStep) -> None:
        rec = self.record
        rec.optimizer_steps += 1
        if self._lead_optimizer is None:
            self._lead_optimizer = ev.optimizer
        if ev.optimizer == self._lead_optimizer and not self._training_known:
            start = self._optimizer_prev_ns or self._t0
            wait = self._wait_total - self._optimizer_wait_mark
            self._row(start, ev.t_ns - start, wait, self._last_batch, SOURCE_OPTIMIZER, 0)
            self._optimizer_prev_ns = ev.t_ns
            self._optimizer_wait_mark = self._wait_total
        self._after_optimizer = True
        cur = self._current
        if cur is None:
            return
        # The loader fetched last trains, and so does any loader fetched alongside it since
        # the previous optimizer step, no more often than it (``zip(a, b)``, an outer loader
        # around an inner draw); not an evaluation that ran since (more batches than that).
        for st in self._by_slot.values():
            if st is cur or (0 < st.since_optimizer <= cur.since_optimizer and st.start >= 0):
                st.info.optimizer_steps += 1
                if st.start >= 0:
                    st.flags |= FLAG_OPTIMIZER_STEP
                    st.last_optimizer_ns = ev.t_ns
                self._training_known = True
            st.since_optimizer = 0

    def _marker(self, ev: Marker) -> None:
        self.record.markers += 1
        start = self._marker_prev_ns or self._t0
        wait = self._wait_total - self._marker_wait_mark
        self._row(start, ev.t_ns - start, wait, self._last_batch, SOURCE_MARKER, 0)
        self._marker_prev_ns = ev.t_ns
        self._marker_wait_mark = self._wait_total

    # --- rows --------------------------------------------------------------------------------
    def _close(self, st: _Loader, t_end_ns: int, next_gpu: Any, *, truncated: bool) -> None:
        """Write ``st``'s open step as a row, ending at ``t_end_ns``."""
        flags = st.flags
        if any(not self._by_slot[slot].info.is_training for slot in st.inside):
            flags |= FLAG_INTERLEAVED
        end = t_end_ns
        if truncated:
            flags |= FLAG_TRUNCATED
            if st.last_optimizer_ns >= 0:
                end = st.last_optimizer_ns
        row = self._row(st.start, end - st.start, st.wait, st.batch, st.slot, flags)
        if st.gpu_enter is not None and next_gpu is not None and self._gpu_sink is not None:
            self._gpu.append((row, st.gpu_enter, st.gpu_exit, next_gpu))
        st.start = -1
        st.inside = set()
        st.last_optimizer_ns = -1
        st.gpu_enter = st.gpu_exit = None
        del self._open[st.slot]

    def _row(
        self, start_ns: int, wall_ns: int, wait_ns: int, batch: int, source: int, flags: int
    ) -> int:
        """Queue one row (times relative to the run start) and return its index in the table."""
        self._rows.append((start_ns - self._t0, wall_ns, wait_ns, batch, source, flags))
        return len(self.record.steps) + len(self._rows) - 1

    def _flush(self) -> None:
        """Write the queued rows in one go, then hand the GPU figures of those rows on."""
        if self._rows:
            self.record.steps.extend(self._rows)
            self._rows = []
        if self._gpu:
            pairs, self._gpu = self._gpu, []
            assert self._gpu_sink is not None
            for pair in pairs:
                self._gpu_sink(*pair)
