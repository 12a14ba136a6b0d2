"""GPU input stalls from CUDA events, resolved lazily, with no synchronisation per step.

For each batch an event is recorded on the user's stream when the loader's ``__next__`` is
entered (``enter``) and another when it returns (``exit``). On the GPU timeline an event
completes when the work queued before it is done, so::

    stall = elapsed(enter_k, exit_k)    = max(0, data arrival - GPU done with step k-1)
    span  = elapsed(exit_k, enter_k+1)  = GPU time from the batch's arrival to the next fetch

What a fetch costs the host is two ``Event.record`` calls (and, at most once in
:data:`STREAM_CHECK_EVERY` fetches, a stream look-up); everything else happens when the log is
processed:

* **Pooled events.** Events come from an :class:`EventPool` and go back to it once nothing
  will read them again: after their step's elapsed times were read, or when the segmenter let
  go of them without handing them to a step (a step the run's end truncated, a loader past
  ``MAX_LOADERS``). An event is therefore never recorded again while a reading of it is still
  due. The CUDA pools are shared by the runs of a process, one per device
  (:func:`cuda_event_factory`), so a warm pool creates no event at all.
* **The stream, looked up per iterator.** ``torch.cuda.current_stream`` is looked up at an
  iterator's first fetch of each epoch (its batch count is 0), at the run's first fetch, and
  at every :data:`STREAM_CHECK_EVERY`-th fetch of an iterator; the events of the fetches in
  between are recorded on the stream found then. A change of the current stream in the middle
  of an epoch is therefore seen within :data:`STREAM_CHECK_EVERY` fetches; the current stream
  is the calling thread's, and the one looked up is that of the thread that fetches.
* **Phases.** On the steps whose phases were timed (:mod:`.step_phases`), each phase's start
  and end events come with the step: its GPU time is the elapsed time between them, the input
  copy's from the batch's arrival (the fetch's exit event) to the first forward's start
  (``StepTable.set_gpu_phases``); the phases' events go back to the pool once read.
* **Polling.** Steps are resolved when the log is processed (many steps at once), a few steps
  behind, with ``Event.query()`` (non-blocking): from the oldest step on, one query per step
  that is resolved and at most one that answers "not yet" per processing (events on one
  stream complete in order). The only ``synchronize()`` is on the last event, when the run
  ends.

Any object with ``record(stream)``, ``query()``, ``elapsed_time(other)`` and
``synchronize()`` works as an event, which is how the tests simulate a GPU timeline.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ..events import BEFORE_CLOSURE, FORWARD, EventLike
from ..step_table import PHASE_WIDTH, StepTable

#: The stream is looked up again at every this many fetches of an iterator (a power of two:
#: the check is a mask of the iterator's own batch count), besides its first fetch of an epoch.
STREAM_CHECK_EVERY = 64
STREAM_CHECK_MASK = STREAM_CHECK_EVERY - 1
#: A pool keeps at most this many free events; more are left to the garbage collector (a run
#: whose GPU ran far behind had many events out at once).
POOL_MAX_FREE = 4096


class EventPool:
    """Reusable events: :attr:`free` holds those no reading is due of; :meth:`new` makes one
    when none is free (``created`` counts them). Taking from and putting back into ``free``
    are single list operations, safe between the fetching and the processing thread."""

    def __init__(self, new_event: Callable[[], EventLike], max_free: int = POOL_MAX_FREE) -> None:
        self.new_event = new_event
        self.max_free = max_free
        self.free: list[EventLike] = []
        self.created = 0  #: events made by this pool

    def new(self) -> EventLike:
        self.created += 1
        return self.new_event()

    def put(self, event: EventLike) -> None:
        """``event`` is free again: nothing will read its last recording."""
        if len(self.free) < self.max_free:
            self.free.append(event)


#: (row, enter, exit, next enter, the phases' ``(phase, start, end)`` events or None)
Step = tuple[
    int, EventLike, EventLike, EventLike, tuple[tuple[int, EventLike, EventLike], ...] | None
]


class GpuStallTimer:
    """Records CUDA events around each fetch and fills ``gpu_stall_ms``/``gpu_span_ms``.

    ``events``: an :class:`EventPool`, or a function that makes an event (it then gets a pool
    of its own). ``stream_getter``: the current stream (None: each record looks it up itself).
    ``lag``: how many of the newest steps a poll leaves for a later one (their last event was
    just recorded: the GPU has rarely reached it).
    """

    def __init__(
        self,
        steps: StepTable,
        events: EventPool | Callable[[], EventLike],
        stream_getter: Callable[[], Any] | None = None,
        lag: int = 2,
    ) -> None:
        self._steps = steps
        self.pool = events if isinstance(events, EventPool) else EventPool(events)
        self._free = self.pool.free
        self._get_stream = stream_getter
        self._stream: Any = None
        self._stream_known = stream_getter is None
        self._lag = lag
        self._pending: deque[Step] = deque()
        #: events let go of, each with the number of queued steps after which no step holds
        #: it: it is free once that many steps are done (steps are resolved in order)
        self._released: deque[tuple[int, EventLike]] = deque()
        self._queued = 0  #: steps queued so far
        self._done = 0  #: of them, resolved or given up
        self.resolved = 0
        self.errors = 0
        self.stream_lookups = 0
        self.queries = 0

    # --- the hot path: the training thread -------------------------------------------------
    def mark_enter(self, it: Any) -> EventLike | None:
        """:meth:`mark` at the entry of ``it``'s ``__next__``, looking the stream up first at
        the iterator's first fetch of an epoch and at every :data:`STREAM_CHECK_EVERY`-th."""
        if not it._num_yielded & STREAM_CHECK_MASK or not self._stream_known:
            self._look_up_stream()
        return self.mark()

    def mark(self) -> EventLike | None:
        """Record a free event on the stream and return it (None if that failed: the step's
        GPU figures are then unavailable, the loop goes on)."""
        try:
            try:
                ev = self._free.pop()
            except IndexError:
                ev = self.pool.new()
            ev.record(self._stream)
        except Exception:
            self.errors += 1
            return None
        return ev

    def _look_up_stream(self) -> None:
        self._stream_known = True
        get = self._get_stream
        if get is None:
            return
        self.stream_lookups += 1
        try:
            self._stream = get()
        except Exception:
            self.errors += 1
            self._stream = None  # each record looks it up itself

    # --- processing: whichever thread processes the log ------------------------------------
    def take(self, steps: list[Step], released: Iterable[tuple[int, EventLike]]) -> None:
        """Queue the closed ``steps`` (``(row, enter, exit, next enter, phases)``) for
        resolution, note the events the segmenter let go of (``(k, event)``: no step after the
        first ``k`` of ``steps`` holds it), and resolve what the GPU has already finished."""
        before = self._queued
        self._pending.extend(steps)
        self._queued += len(steps)
        self._released.extend((before + k, ev) for k, ev in released)
        self._poll()
        self._recycle()

    def _poll(self) -> None:
        pending = self._pending
        while len(pending) > self._lag:
            self.queries += 1
            try:
                if not pending[0][3].query():
                    return
            except Exception:  # a device error: this step's figures stay unavailable
                self.errors += 1
                _, enter, exit_, _, _ = pending.popleft()
                self._done += 1
                self.pool.put(enter)
                self.pool.put(exit_)
                continue
            self._resolve(pending.popleft())

    def _resolve(self, item: Step) -> None:
        """Read ``item``'s stall, span and phases, then put its own two events back in the
        pool (its ``next_enter`` is the next step's own)."""
        row, enter, exit_, next_enter, phases = item
        self._done += 1
        try:
            stall = max(0.0, enter.elapsed_time(exit_))
            span = max(0.0, exit_.elapsed_time(next_enter))
            self._steps.set_gpu(row, stall, span)
            self.resolved += 1
        except Exception:  # an event from a reset device: leave the row unavailable
            self.errors += 1
            phases = None
        if phases is not None:
            self._resolve_phases(row, exit_, phases)
        put = self.pool.put
        put(enter)
        put(exit_)

    def _resolve_phases(self, row: int, arrival: EventLike, phases: Any) -> None:
        """The GPU time of each of the step's phases, ms (the copy: from ``arrival`` to the first
        forward's start, less the phases logged before it, as the host's: an optimizer's step
        before its closure, ``BEFORE_CLOSURE``, stays in it; NaN without a forward); their
        events go back to the pool."""
        times = [0.0] * PHASE_WIDTH
        try:
            copy = math.nan  # (no forward)
            between = 0.0  # the phases' time from the arrival to the first forward
            for phase, start, end in phases:
                if phase == BEFORE_CLOSURE:
                    continue
                spent = max(0.0, start.elapsed_time(end))
                times[phase + 1] += spent
                if not math.isnan(copy):
                    continue
                if phase == FORWARD:
                    copy = max(0.0, arrival.elapsed_time(start) - between)
                elif arrival.elapsed_time(start) >= 0:
                    between += spent
            times[0] = copy
        except Exception:  # as above: the row keeps no GPU phases, the events are not reused
            self.errors += 1
            return
        self._steps.set_gpu_phases(row, times)
        put = self.pool.put
        for _, start, end in phases:
            put(start)
            put(end)

    def _recycle(self) -> None:
        """Put back into the pool the events let go of whose steps are all done."""
        released = self._released
        done = self._done
        put = self.pool.put
        while released and released[0][0] <= done:
            put(released.popleft()[1])

    def finish(self) -> None:
        """The single synchronisation of the run: wait for the last event, resolve the rest."""
        pending = self._pending
        if pending:
            try:
                pending[-1][3].synchronize()
            except Exception:  # the device is gone: nothing is read, nothing goes back
                self.errors += len(pending)
                pending.clear()
                self._released.clear()
                return
            while pending:
                self._resolve(pending.popleft())
        self._recycle()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def out(self) -> int:
        """Events let go of that wait for their steps to be resolved."""
        return len(self._released)


_cuda_pools: dict[int, EventPool] = {}
_cuda_pools_lock = threading.Lock()


def cuda_event_factory(device: int | None = None) -> EventPool:
    """The pool of timing-enabled ``torch.cuda.Event`` of ``device`` (default: the current
    device), shared by every run of the process: an event is created on the device of the
    stream it is first recorded on and cannot be recorded on another device's."""
    import torch

    index = torch.cuda.current_device() if device is None else int(device)
    with _cuda_pools_lock:
        pool = _cuda_pools.get(index)
        if pool is None:

            def new_event() -> EventLike:
                return torch.cuda.Event(enable_timing=True)  # type: ignore[return-value]

            pool = _cuda_pools[index] = EventPool(new_event)
    return pool


def cuda_stream_getter(device: int) -> Callable[[], Any]:
    """The stream the user computes on: the current stream of ``device`` when it is called."""
    import torch

    current_stream = torch.cuda.current_stream

    def get() -> Any:
        return current_stream(device)

    return get
