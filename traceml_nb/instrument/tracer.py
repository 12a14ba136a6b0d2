"""The training thread's side of a run: log each fetch, optimizer step and marker, and have the
log turned into step rows (:class:`~traceml_nb.segment.StepSegmenter`) in batches.

The hot path, a fetch, reads two clocks and the iterator's batch count, reads the batch size and
appends one :class:`~traceml_nb.events.Fetch` to the log; an optimizer step appends one
:class:`~traceml_nb.events.OptimizerStep`. Everything else happens later, many events at a time:

* with a reader attached (:meth:`StepTracer.attach_reader`: the live view, which asks for fresh
  rows before each of its updates) the reader's thread segments the log; the training thread
  does it only past :data:`READER_MAX_EVENTS` events (a reader that fell behind or stopped);
* without one, the training thread does it every :data:`PROCESS_EVENTS` events;
* the run's end segments the rest and closes what is still open.

A failure of our own bookkeeping stops the tracing for the rest of the run (the steps before it
are kept, :attr:`StepTracer.error` says why), never the user's loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..events import Event, Exhausted, Fetch, IteratorStarted, Marker, OptimizerStep
from ..record import RunRecord
from ..segment import StepSegmenter
from .gpu_events import GpuStallTimer
from .loader import batch_size_of, loader_settings

#: Without a reader, the training thread segments the log once it holds this many events
#: (about every 128 steps of a loop with one fetch and one optimizer step a step).
PROCESS_EVENTS = 256
#: With a reader attached, the training thread segments the log only once it holds this many
#: events (a reader that fell behind or stopped; the log stays bounded, about 1 MB).
READER_MAX_EVENTS = 8192

T = TypeVar("T")


class StepTracer:
    """Receives the instrumented events of one run and has them segmented into its record."""

    def __init__(
        self,
        record: RunRecord,
        gpu: GpuStallTimer | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.record = record
        self.gpu = gpu
        self.clock = clock
        #: False once the run has ended or the tracing stopped: the wrapper calls through
        self.active = True
        #: why the tracing stopped during the run (a failure of ours), else None
        self.error: str | None = None
        #: events not segmented yet, in order (always this list: the wrapper holds it)
        self.log: list[Event] = []
        #: the log length at which the logging thread segments it
        self.max_log = PROCESS_EVENTS
        #: held while the log is segmented; a reader holds it to read rows and loaders alike
        self.lock = threading.Lock()
        #: time the logging threads (the training loop) spent segmenting, ns
        self.processing_ns = 0
        #: ...and the time readers spent on it, on their own threads, ns
        self.reader_processing_ns = 0
        self._segmenter = StepSegmenter(record, gpu.add if gpu is not None else None)
        self._announced: set[int] = set()  # ids of the iterators announced to the segmenter
        #: loader key -> its batch sampler, held so that no other object takes its id
        self._loaders: dict[int, Any] = {}

    # --- the hot path ---------------------------------------------------------------------
    def wrap_next(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A ``__next__`` that calls ``original`` and logs the fetch; once the tracer is no
        longer :attr:`active` it only calls through (harmless if something stacked on top of
        it keeps calling it)."""
        tracer = self
        clock = self.clock
        log = self.log
        append = log.append
        announced = self._announced
        mark = self.gpu.mark if self.gpu is not None else None

        def __next__(it: Any) -> Any:
            __tracebackhide__ = True  # noqa: F841 (IPython and pytest hide this frame)
            if not tracer.active:
                return original(it)
            t_enter = clock()
            gpu_enter = mark() if mark is not None else None
            try:
                batch = original(it)
            except StopIteration:
                append(Exhausted(id(it), t_enter, gpu_enter))
                raise
            t_exit = clock()
            gpu_exit = mark() if mark is not None else None
            key = id(it)
            number = it._num_yielded
            if number == 1 or key not in announced:
                tracer.announce(it, key)
            append(Fetch(key, number, t_enter, t_exit, batch_size_of(batch), gpu_enter, gpu_exit))
            if len(log) >= tracer.max_log:
                tracer.process_due()
            return batch

        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        __next__.__qualname__ = getattr(original, "__qualname__", "__next__")
        __next__.__doc__ = getattr(original, "__doc__", None)
        return __next__

    def announce(self, it: Any, key: int) -> None:
        """Log that iterator ``it`` (id ``key``) starts an epoch or is new to the run, with its
        loader's settings the first time that loader is seen."""
        try:
            sampler = it._index_sampler
            loader = id(sampler)
            settings = None
            if loader not in self._loaders:
                self._loaders[loader] = sampler
                settings = loader_settings(it)
            self._announced.add(key)
            self.log.append(IteratorStarted(key, loader, settings))
        except Exception as exc:
            self.stop_on_error(exc)

    def on_optimizer_step(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        """A global optimizer post-step hook: log the step."""
        if self.active:
            log = self.log
            log.append(OptimizerStep(id(optimizer), self.clock()))
            if len(log) >= self.max_log:
                self.process_due()

    def marker(self) -> None:
        """An explicit end of a step (``traceml_nb.step()``)."""
        if self.active:
            log = self.log
            log.append(Marker(self.clock()))
            if len(log) >= self.max_log:
                self.process_due()

    # --- segmenting the log ---------------------------------------------------------------
    def attach_reader(self, attached: bool = True) -> None:
        """A thread that reads the rows while the run goes on calls :meth:`process` before each
        read; the training thread then only logs, up to :data:`READER_MAX_EVENTS` events.
        ``False`` when the reader stops: the training thread takes the work back."""
        self.max_log = READER_MAX_EVENTS if attached else PROCESS_EVENTS

    def process(self) -> None:
        """Segment the events logged so far, now (a reader, before it reads; its time counts in
        :attr:`reader_processing_ns`). A failure stops the tracing, not the reader."""
        self.reader_processing_ns += self._process()

    def read(self, reader: Callable[[], T]) -> T:
        """Segment the events logged so far and return ``reader()``, both under :attr:`lock`,
        so that what it reads (rows, loaders, counters) is one consistent state. Its time
        counts in :attr:`reader_processing_ns`."""
        t0 = time.perf_counter_ns()
        try:
            with self.lock:
                try:
                    self._segment()
                except Exception as exc:
                    self.stop_on_error(exc)
                return reader()
        finally:
            self.reader_processing_ns += time.perf_counter_ns() - t0

    def process_due(self) -> None:
        """The logging thread's segmenting (the log has reached :attr:`max_log`)."""
        self.processing_ns += self._process()

    def _process(self) -> int:
        """Segment the log; returns the time it took (real time, whatever :attr:`clock` is), ns."""
        t0 = time.perf_counter_ns()
        try:
            with self.lock:
                self._segment()
        except Exception as exc:
            self.stop_on_error(exc)
        return time.perf_counter_ns() - t0

    def _segment(self) -> None:
        """Segment the log (the caller holds :attr:`lock`). If it is interrupted (Ctrl-C while
        it runs on the training thread) the events it had not reached go back to the front of
        the log, for :meth:`close`."""
        log = self.log
        n = len(log)
        events = log[:n]
        del log[:n]  # what another thread appended meanwhile stays, in order
        pending = iter(events)
        try:
            self._segmenter.feed(pending)
        except BaseException:
            log[:0] = list(pending)
            raise

    def stop_on_error(self, exc: Exception) -> None:
        """Stop tracing for the rest of the run because ``exc`` broke our bookkeeping: the
        wrapper calls through, optimizer steps and markers are ignored, the log is dropped."""
        self.error = f"{type(exc).__name__}: {exc}"
        self.deactivate()
        self.max_log = 1 << 62
        self.log.clear()

    def deactivate(self) -> None:
        """Log nothing more."""
        self.active = False

    # --- end ------------------------------------------------------------------------------
    def close(self) -> None:
        """Segment the rest of the log, close every open step at the run's end and resolve the
        GPU events (the run's one synchronisation); after an :attr:`error`, only let go of the
        loaders. A reader may still call :meth:`process` afterwards: it finds nothing."""
        self.deactivate()
        t_end = self.clock()
        t0 = time.perf_counter_ns()
        with self.lock:
            try:
                if self.error is None:
                    self._segment()
                    self._segmenter.finish(t_end)
                    self.processing_ns += time.perf_counter_ns() - t0
                    if self.gpu is not None:
                        self.gpu.finish()
            finally:
                self._loaders.clear()  # a sampler holds its dataset
                self._announced.clear()
