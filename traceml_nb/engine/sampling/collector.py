"""The background collector: one daemon thread that reads every sample source periodically.

A source is anything with a ``table`` (:class:`~traceml_nb.engine.record.SampleTable`), a
``read() -> dict`` of column values (``None`` = unavailable) and ``close()``. A source that
raises :class:`SourceLost` is dropped with its reason noted in the capabilities; any other
exception is noted too and the source is dropped, so a failing sampler never reaches training.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..capabilities import Capabilities
from ..record import SampleTable

THREAD_NAME = "traceml-sampler"


class SourceLost(Exception):
    """A source can no longer be read (GPU fell off the bus, NVML shut down...)."""


class SampleSource(Protocol):
    name: str
    table: SampleTable

    def read(self) -> dict[str, float | int | None]: ...

    def close(self) -> None: ...


class Collector:
    """Samples ``sources`` every ``interval`` seconds on a daemon thread until :meth:`stop`."""

    def __init__(
        self,
        sources: Sequence[SampleSource],
        interval: float,
        capabilities: Capabilities,
        t0: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.sources = list(sources)
        self.interval = interval
        self.capabilities = capabilities
        self.t0 = t0
        self.clock = clock
        self.busy_s = 0.0  #: thread CPU time spent sampling, for the overhead report
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.sources:
            return
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        """Sample at once (so short runs have a sample at t≈0), then every ``interval`` on a
        fixed schedule: the time a read takes does not stretch the period. Every read happens on
        this thread, never on the training thread."""
        try:
            due = time.monotonic()
            while True:
                self.sample_once()
                if not self.sources:
                    return
                due += self.interval
                now = time.monotonic()
                if due <= now:  # a slow read overran the period: skip the ticks it missed
                    due = now + self.interval
                if self._stop.wait(due - now):
                    return
        except BaseException as exc:  # never let the thread die silently
            self.capabilities.note(f"sampler stopped: {type(exc).__name__}: {exc}")

    def sample_once(self) -> None:
        c0 = time.thread_time()
        t = self.clock() - self.t0
        for src in list(self.sources):
            try:
                values = src.read()
            except SourceLost as exc:
                self._drop(src, f"{src.name} lost at t={t:.1f}s: {exc}")
                continue
            except Exception as exc:
                self._drop(
                    src, f"{src.name} sampler failed at t={t:.1f}s: {type(exc).__name__}: {exc}"
                )
                continue
            src.table.append(t, values)
        self.ticks += 1
        self.busy_s += time.thread_time() - c0

    def _drop(self, src: SampleSource, message: str) -> None:
        self.capabilities.note(message)
        self.sources.remove(src)
        try:
            src.close()
        except Exception:
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close every source. Safe to call twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                self.capabilities.note("sampler thread did not stop within 5 s; left as a daemon")
            self._thread = None
        for src in self.sources:
            try:
                src.close()
            except Exception:
                pass
        self.sources = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
