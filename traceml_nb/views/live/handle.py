"""The display-handle view: a live status line and mini chart, one HTML output updated in place.

The fallback where widgets do not render (Colab, Kaggle, ``--view html``): it needs nothing
but ``display(..., display_id=True)`` and ``update_display``, which every Jupyter frontend
supports. One writer thread reads record snapshots and publishes at most one update per
second (each update re-sends the whole output, so it is kept small: a few kB).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from html import escape
from typing import Any

import numpy as np

from ...analysis.formatting import fmt_ms, fmt_s, fmt_share
from ...analysis.step_blocks import block_means, block_steps
from ...analysis.steps import StepRule, rule_of
from ...engine.rank_record import RankRecord
from ...engine.record import RecordSnapshot
from ...engine.run import Run
from ..chart import step_chart_svg
from ..report_content import StepChart
from .data import RECENT_STEPS, Rereads, SnapshotReader, StepRows
from .rank_figures import figures_of, slowest_parts

THREAD_NAME = "traceml-handle-view"
MIN_TICK_S = 1.0  #: at most one update a second
CHART_STEPS = 200  #: steps the mini chart shows


@dataclass
class LiveStatus:
    """What the handle view shows at one moment (times in ms, share 0..1)."""

    name: str
    state: str  #: "running", or the run's final status
    elapsed_s: float
    steps: int  #: steps of the shown step source so far
    recent_wall_ms: list[float] = field(default_factory=list)
    recent_wait_ms: list[float] = field(default_factory=list)
    #: for a run that launched ranks, the rank whose steps these are ("rank 1 (slowest of
    #: 2)") and its figures (:func:`~.rank_figures.slowest_parts`); '' for the run's own steps
    rank: str = ""
    rank_figures: str = ""
    #: the training loader's workers: from two on, the step time is over blocks of whole
    #: rounds of them, as the report's (:mod:`traceml_nb.analysis.step_blocks`)
    workers: int = 0

    @property
    def step_ms(self) -> float | None:
        """Median step time of the last ``RECENT_STEPS`` steps (the median the live view's
        rank figures take, :func:`~.rank_figures.figures_of`); with two workers or more, the
        median of the means of blocks of whole rounds of them."""
        recent = self.recent_wall_ms[-RECENT_STEPS:]
        if not recent:
            return None
        block = block_steps(self.workers, len(recent))
        return statistics.median(block_means(np.asarray(recent), block).tolist())

    @property
    def data_wait_share(self) -> float | None:
        """Data wait / step time over the last ``RECENT_STEPS`` steps."""
        walls = sum(self.recent_wall_ms[-RECENT_STEPS:])
        return sum(self.recent_wait_ms[-RECENT_STEPS:]) / walls if walls > 0 else None

    def headline(self) -> str:
        state = "running" if self.state == "running" else f"{self.state}; the report follows"
        parts = [f'traceml · "{self.name}" · {state} · {fmt_s(self.elapsed_s)}']
        if self.rank:
            parts.append(self.rank)
        parts.append(f"{self.steps:,} steps")
        if self.rank_figures:
            parts.append(self.rank_figures)
        elif self.step_ms is not None:
            parts.append(f"step {fmt_ms(self.step_ms)}")
        if self.data_wait_share is not None and not self.rank_figures:
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
    """Reads new step rows through the engine and keeps the last ``keep`` steps."""

    def __init__(self, read: SnapshotReader, keep: int = CHART_STEPS) -> None:
        self.read = read
        self.keep = keep
        self._read = 0
        self._rule: StepRule | None = None
        self._recent: deque[tuple[float, float]] = deque(maxlen=keep)
        self._count = 0
        self._rereads = Rereads()
        self.workers = 0  #: the workers of the loader whose steps these are (the most of them)

    def poll(self, *, final: bool = False) -> tuple[int, list[float], list[float]]:
        """``(steps, recent step ms, recent data wait ms)`` of the run's steps so far
        (``final``: the run is over; a changed rule is read at once)."""
        snap = self.read(self._read)
        rule = rule_of(snap)
        shown = self._rule
        again = self._rereads.due(shown, rule, final)
        with self._rereads.reading() if again else nullcontext():
            if again:  # the steps are other rows now: read them all again
                snap = self.read(0)
                rule = rule_of(snap)
                self._rule = rule
                self._read = 0
                self._recent.clear()
                self._count = 0
            elif shown is not None:
                rule = shown  # (evaluations found since: read with the rule shown until then)
            self._read += len(snap.steps)
            rows = StepRows.of_rule(snap.steps, rule)
            self.workers = _workers(snap, rule, self.workers)
            self._count += len(rows)
            for wall, wait in zip(
                rows.wall_ns[-self.keep :], rows.wait_ns[-self.keep :], strict=True
            ):
                self._recent.append((wall / 1e6, wait / 1e6))
        recent = list(self._recent)
        return self._count, [r[0] for r in recent], [r[1] for r in recent]


def _workers(snap: RecordSnapshot, rule: StepRule, known: int) -> int:
    """The workers of the loader the steps are of (its rows', or inside them; else the
    training loaders'), as the report reads them (``analysis.steps.training_loader``)."""
    own = [info for info in snap.loaders if info.slot in rule.sources + rule.inner]
    infos = own or [info for info in snap.loaders if info.is_training]
    return max((info.num_workers for info in infos), default=known)


def _reader_of(rec: RankRecord) -> SnapshotReader:
    """Reads the rows the kernel has received from the rank of ``rec``."""

    def read(row: int) -> RecordSnapshot:
        return rec.record.snapshot(row, samples=False)

    return read


class HandleView:
    """Shows a :class:`LiveStatus` of ``run`` under the cell and refreshes it every ``tick_s``.

    ``display=False`` runs without publishing anything (tests read :meth:`status`).
    """

    def __init__(self, run: Run, *, tick_s: float = MIN_TICK_S, display: bool = True) -> None:
        self.run = run
        self.tick_s = max(MIN_TICK_S, tick_s)
        self.display = display
        self.updates = 0
        self._steps = RecentSteps(lambda row: run.snapshot(row, samples=False))
        self._rank_steps: dict[tuple[int, int], RecentSteps] = {}
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self, *, final: bool = False) -> LiveStatus:
        """The run's state now (``final``: after the run); for a run that launched ranks, its
        slowest rank's steps."""
        followed = self._slowest_rank(final)
        if followed is not None:
            return followed
        steps, walls, waits = self._steps.poll(final=final)
        run = self.run
        status = LiveStatus(run.name, run.status, run.elapsed_s, steps, walls, waits)
        status.workers = self._steps.workers
        return status

    def _slowest_rank(self, final: bool) -> LiveStatus | None:
        ranks = list(getattr(self.run, "ranks", ()))
        if not ranks:
            return None
        polled = {}
        for rec in ranks:
            key = (rec.launch, rec.rank)
            reader = self._rank_steps.get(key)
            if reader is None:
                reader = self._rank_steps[key] = RecentSteps(_reader_of(rec))
            polled[key] = (rec, reader.poll(final=final))
        latest = max(launch for launch, _ in polled)
        found = slowest_parts(
            [
                figures_of(rec, *seen)
                for (launch, _), (rec, seen) in polled.items()
                if launch == latest
            ]
        )
        if found is None:
            return None
        figures, who, said = found
        _, (steps, walls, waits) = polled[(figures.launch, figures.rank)]
        run = self.run
        return LiveStatus(run.name, run.status, run.elapsed_s, steps, walls, waits, who, said)

    def start(self) -> None:
        if self.display:
            from IPython.display import display

            self._handle = display(self.status(), display_id=True)
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with self.run.reading():  # this thread asks for the step rows: the loop only logs
            while not self._stop.wait(self.tick_s):
                try:
                    self._publish()
                except Exception:  # a failed update must never reach the training thread
                    return

    def _publish(self, final: bool = False) -> None:
        status = self.status(final=final)
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
            self._publish(final=True)
