"""GPU input stalls from CUDA events, resolved lazily, with no synchronisation per step.

For each batch an event is recorded on the user's stream when the loader's ``__next__`` is
entered (``enter``) and another when it returns (``exit``). On the GPU timeline an event
completes when the work queued before it is done, so::

    stall = elapsed(enter_k, exit_k)    = max(0, data arrival - GPU done with step k-1)
    span  = elapsed(exit_k, enter_k+1)  = GPU time from the batch's arrival to the next fetch

Steps are resolved a few steps behind with ``Event.query()`` (non-blocking); the only
``synchronize()`` is on the last event, when the run ends.

Any object with ``record(stream)``, ``query()``, ``elapsed_time(other)`` and
``synchronize()`` works as an event, which is how the tests simulate a GPU timeline.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..record import StepTable


class EventLike(Protocol):
    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...
    def synchronize(self) -> None: ...


class GpuStallTimer:
    """Records CUDA events around each fetch and fills ``gpu_stall_ms``/``gpu_span_ms``.

    ``lag``: how many steps may be pending before we start polling the oldest one; polling
    costs one ``query()`` per step, and at most ``max_resolve`` steps are resolved per call.
    """

    def __init__(
        self,
        steps: StepTable,
        event_factory: Callable[[], EventLike],
        stream_getter: Callable[[], Any] | None = None,
        lag: int = 2,
        max_resolve: int = 4,
    ) -> None:
        self._steps = steps
        self._new_event = event_factory
        self._stream = stream_getter or (lambda: None)
        self._lag = lag
        self._max_resolve = max_resolve
        self._pending: deque[tuple[int, EventLike, EventLike, EventLike]] = deque()
        self.resolved = 0
        self.errors = 0

    def mark(self) -> EventLike | None:
        """Record a new event on the current stream and return it (None if that failed: the
        step's GPU figures are then unavailable, the loop goes on)."""
        try:
            ev = self._new_event()
            ev.record(self._stream())
        except Exception:
            self.errors += 1
            return None
        return ev

    def add(self, row: int, enter: EventLike, exit_: EventLike, next_enter: EventLike) -> None:
        """Queue step ``row`` for resolution and resolve what the GPU has already finished."""
        pending = self._pending
        pending.append((row, enter, exit_, next_enter))
        if len(pending) > self._lag:
            self._poll()

    def _poll(self) -> None:
        pending = self._pending
        for _ in range(self._max_resolve):
            if not pending or not pending[0][3].query():
                return
            self._resolve(pending.popleft())

    def _resolve(self, item: tuple[int, EventLike, EventLike, EventLike]) -> None:
        row, enter, exit_, next_enter = item
        try:
            stall = max(0.0, enter.elapsed_time(exit_))
            span = max(0.0, exit_.elapsed_time(next_enter))
            self._steps.set_gpu(row, stall, span)
            self.resolved += 1
        except Exception:  # an event from a reset device: leave the row unavailable
            self.errors += 1

    def finish(self) -> None:
        """The single synchronisation of the run: wait for the last event, resolve the rest."""
        pending = self._pending
        if not pending:
            return
        try:
            pending[-1][3].synchronize()
        except Exception:
            self.errors += len(pending)
            pending.clear()
            return
        while pending:
            self._resolve(pending.popleft())

    @property
    def pending(self) -> int:
        return len(self._pending)


def cuda_event_factory() -> Callable[[], EventLike]:
    """The real event class: timing-enabled ``torch.cuda.Event``."""
    import torch

    def new_event() -> EventLike:
        return torch.cuda.Event(enable_timing=True)  # type: ignore[return-value]

    return new_event


def cuda_stream_getter(device: int) -> Callable[[], Any]:
    """The stream the user computes on (the current stream of ``device`` at record time)."""
    import torch

    current_stream = torch.cuda.current_stream

    def get() -> Any:
        return current_stream(device)

    return get
