"""The display-handle view: a live status line and mini chart, one HTML output updated in place.

The fallback where widgets do not render (Colab, Kaggle, ``--view html``): it needs nothing
but ``display(..., display_id=True)`` and ``update_display``, which every Jupyter frontend
supports. One writer thread reads record snapshots and publishes at most one update per
second (each update re-sends the whole output, so it is kept small: a few kB).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ..analysis.formatting import fmt_share
from ..record import RunRecord
from .report import StepChart, step_chart_svg
from .text import format_ms, format_seconds

THREAD_NAME = "traceml-handle-view"
MIN_TICK_S = 1.0  #: at most one update a second
RECENT_STEPS = 200  #: steps the mini chart shows
STATS_STEPS = 50  #: steps behind the live median and data-wait share


@dataclass
class LiveStatus:
    """What the handle view shows at one moment (times in ms, share 0..1)."""

    name: str
    state: str  #: "running", or the run's final status
    elapsed_s: float
    steps: int  #: steps of the shown step source so far
    recent_wall_ms: list[float] = field(default_factory=list)
    recent_wait_ms: list[float] = field(default_factory=list)

    @property
    def step_ms(self) -> float | None:
        """Median step time of the last ``STATS_STEPS`` steps."""
        recent = sorted(self.recent_wall_ms[-STATS_STEPS:])
        return recent[len(recent) // 2] if recent else None

    @property
    def data_wait_share(self) -> float | None:
        """Data wait / step time over the last ``STATS_STEPS`` steps."""
        walls = sum(self.recent_wall_ms[-STATS_STEPS:])
        return sum(self.recent_wait_ms[-STATS_STEPS:]) / walls if walls > 0 else None

    def headline(self) -> str:
        state = "running" if self.state == "running" else f"{self.state}; the report follows"
        parts = [f'traceml · "{self.name}" · {state} · {format_seconds(self.elapsed_s)}']
        parts.append(f"{self.steps:,} steps")
        if self.step_ms is not None:
            parts.append(f"step {format_ms(self.step_ms)}")
        if self.data_wait_share is not None:
            parts.append(f"data wait {fmt_share(self.data_wait_share)}")
        return " · ".join(parts)

    def _repr_html_(self) -> str:
        chart = ""
        if self.recent_wall_ms:
            chart = step_chart_svg(
                StepChart(self.recent_wall_ms, self.recent_wait_ms), width=480, height=110
            )
        return (
            '<div class="traceml-live" style="font-family:system-ui,sans-serif;font-size:12px">'
            f"{escape(self.headline())}<br>{chart}</div>"
        )

    def __repr__(self) -> str:
        return self.headline()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.headline())


class RecentSteps:
    """Reads new step rows from a record and keeps the last ones of the shown step source."""

    def __init__(self, record: RunRecord, keep: int = RECENT_STEPS) -> None:
        self.record = record
        self.keep = keep
        self._read = 0
        self._recent: dict[int, deque[tuple[float, float]]] = {}
        self._counts: dict[int, int] = {}

    def poll(self) -> tuple[int, list[float], list[float]]:
        """``(steps, recent step ms, recent data wait ms)`` of the source the live chart shows."""
        from .live_data import choose_step_source

        cols = self.record.steps.snapshot(self._read)
        self._read += len(cols)
        for source, wall, wait in zip(cols.source, cols.wall_ns, cols.wait_ns, strict=True):
            recent = self._recent.get(source)
            if recent is None:
                recent = self._recent[source] = deque(maxlen=self.keep)
            recent.append((wall / 1e6, wait / 1e6))
            self._counts[source] = self._counts.get(source, 0) + 1
        source = choose_step_source(self.record)
        if source is None or source not in self._recent:
            return 0, [], []
        rows = self._recent[source]
        return self._counts[source], [r[0] for r in rows], [r[1] for r in rows]


class HandleView:
    """Shows a :class:`LiveStatus` of ``run`` under the cell and refreshes it every ``tick_s``.

    ``display=False`` runs without publishing anything (tests read :meth:`status`).
    """

    def __init__(self, run: Any, *, tick_s: float = MIN_TICK_S, display: bool = True) -> None:
        self.run = run
        self.tick_s = max(MIN_TICK_S, tick_s)
        self.display = display
        self.updates = 0
        self._steps = RecentSteps(run.record)
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self) -> LiveStatus:
        steps, walls, waits = self._steps.poll()
        return LiveStatus(self.run.name, self.run.status, self.run.elapsed_s, steps, walls, waits)

    def start(self) -> None:
        if self.display:
            from IPython.display import display

            self._handle = display(self.status(), display_id=True)
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with self.run.step_reader():  # this thread brings the step rows up to date
            while not self._stop.wait(self.tick_s):
                try:
                    self._publish()
                except Exception:  # a failed update must never reach the training thread
                    return

    def _publish(self) -> None:
        self.run.process_steps()
        status = self.status()
        if self._handle is not None:
            self._handle.update(status)
        self.updates += 1

    def stop(self) -> None:
        """Stop the thread and publish the final state. Safe to call twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)
            self._thread = None
            self._publish()
