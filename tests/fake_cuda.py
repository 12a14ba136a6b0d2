"""A simulated GPU timeline with events that follow ``torch.cuda.Event``'s contract.

Only the hardware boundary is faked: ``record(stream)``, ``query()``, ``elapsed_time(other)``
and ``synchronize()``. Time is a fake host clock in nanoseconds that the test advances; the
stream runs queued kernels one after another, so an event completes when the work queued
before it is done (or when it was recorded, if the GPU was idle).
"""

from __future__ import annotations


class FakeTimeline:
    def __init__(self) -> None:
        self.now_ns = 0  #: host clock
        self.busy_until_ns = 0  #: when the GPU finishes the work queued so far
        self.records = 0
        self.queries = 0
        self.syncs = 0

    def clock(self) -> int:
        return self.now_ns

    def host(self, ms: float) -> None:
        """The host spends ``ms`` (Python, waiting for data...)."""
        self.now_ns += int(ms * 1e6)

    def launch(self, ms: float) -> None:
        """Queue a kernel of ``ms`` GPU time (asynchronous: costs the host nothing)."""
        self.busy_until_ns = max(self.busy_until_ns, self.now_ns) + int(ms * 1e6)

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, timeline: FakeTimeline) -> None:
        self._tl = timeline
        self.done_at_ns: int | None = None

    def record(self, stream: object = None) -> None:
        tl = self._tl
        tl.records += 1
        self.done_at_ns = max(tl.now_ns, tl.busy_until_ns)

    def _done(self) -> bool:
        assert self.done_at_ns is not None, "query() before record()"
        return self._tl.now_ns >= self.done_at_ns

    def query(self) -> bool:
        self._tl.queries += 1
        return self._done()

    def elapsed_time(self, end_event: FakeEvent) -> float:
        if self.done_at_ns is None or end_event.done_at_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self._done() and end_event._done()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end_event.done_at_ns - self.done_at_ns) / 1e6

    def synchronize(self) -> None:
        tl = self._tl
        tl.syncs += 1
        assert self.done_at_ns is not None
        tl.now_ns = max(tl.now_ns, self.done_at_ns)
