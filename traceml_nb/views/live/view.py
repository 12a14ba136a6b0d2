"""The live view: Bokeh charts under the running cell, fed by one writer thread.

::

    view = LiveView(run)   # run: a started traceml_nb.Run
    view.start()           # BokehJS inline + the charts; the "traceml-view" thread starts
    ...                    # training
    view.stop()            # joins the thread, sends the final points

Cost rules: one writer thread; at most 4 ticks per second, fewer when the view's own work
would take more than ``VIEW_MAX_DUTY`` of a core (a slow machine), the step log turned into
rows every ``READ_EVERY_S`` in between, whatever the pace; each tick
reads only the rows added since the last one, turns them into at most one update per chart
source (:mod:`.data`: batched, downsampled, bounded) and sends *all* of the tick's
changes as one Bokeh ``PATCH-DOC`` message (three comm messages), so the frontend gets at
most 12 messages per second whatever the step rate. The view never writes to the record and
never raises into the user's cell: a failure stops the view and is noted in the run's
capabilities.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource

from ...analysis.pipeline import Analysis
from ...analysis.thresholds import MIN_STEADY_STEPS
from ...engine.capabilities import Capabilities
from ...engine.record import RecordSnapshot
from ...engine.run import Run
from .bokeh_patch import BatchedBokehModel
from .charts import OWN_STEP_TITLE, PHASES_STEP_TITLE, LiveCharts, header_html, points_of
from .data import MAX_POINTS, SeriesUpdate, StepSeries, recent_rate
from .rank_figures import slowest_parts
from .rank_lines import STEP_TITLE, RankLines
from .verdict import RunningVerdict

THREAD_NAME = "traceml-view"
MIN_TICK_S = 0.25  #: at most 4 ticks per second
#: Seconds between updates by default: 2 a second keep the charts live at half the cost of 4
#: (the budget is 1% of the run time, and a run of a few seconds spends much of it settling).
#: The first update comes after ``MIN_TICK_S``.
DEFAULT_TICK_S = 0.5
#: The view's own work (the copies, the charts' messages, the running verdict; not the engine's
#: turning of the step log into rows, which the run needs with or without a view) takes at most
#: this share of one core: a tick that cost more puts the next one off, up to ``MAX_TICK_S``.
#: With the engine's reading (~4 us a step on the view's thread: 0.4% of a 1 ms step) it keeps
#: the view within its budget, 1% of the run (benchmarks/README.md).
VIEW_MAX_DUTY = 0.004
MAX_TICK_S = 2.0  #: ...so that the charts never stand still longer than this
#: Between ticks the view's thread has the run's step log turned into rows this often, so that
#: the training loop never has to (it does once its log holds ``READER_MAX_EVENTS``, 8,192
#: events: within ``MAX_TICK_S`` that is any loop past ~2,000 steps a second; within this
#: interval, past ~16,000).
READ_EVERY_S = 0.25
ANALYSIS_MIN_INTERVAL_S = 1.0  #: the running verdict is recomputed at most once a second
ANALYSIS_MAX_DUTY = 0.002  #: ...and takes at most this share of one core
ANALYSIS_MAX_ERRORS = 3  #: consecutive analysis failures after which the verdict is dropped
RATE_WINDOW_S = 3.0  #: the header's steps/s is measured over this many recent seconds
#: For this many seconds after the start, new points are sent as a replacement of the whole
#: (still small) series instead of a stream: the frontend drops messages that arrive before
#: the widget's view exists, and a replacement repairs whatever an earlier one lost.
SETTLE_S = 5.0
SETTLE_MAX_POINTS = 500  #: ...as long as the series has at most this many points
SMALL_UPDATE_POINTS = 16  #: streams of at most this many points are sent as JSON lists


def tick_wait_s(own_s: float, tick_s: float, max_duty: float = VIEW_MAX_DUTY) -> float:
    """Seconds until the next tick after one whose own work took ``own_s`` CPU seconds: the
    usual ``tick_s``, or long enough that the view's work stays within ``max_duty`` of a core,
    but never past ``MAX_TICK_S`` (nor below ``tick_s``)."""
    return max(tick_s, min(own_s / max_duty, MAX_TICK_S))


def _as_float32(values: Any) -> np.ndarray:
    """float32 is plenty for a chart and halves the bytes sent."""
    return np.asarray(values, dtype=np.float32)


def _on_the_wire(values: np.ndarray) -> Any:
    """A few values go as a JSON list (cheaper to encode than an array), more as float32."""
    if len(values) <= SMALL_UPDATE_POINTS:
        return values.tolist()
    return _as_float32(values)


def load_bokehjs_inline() -> list[Any]:
    """Put BokehJS in the page, inline and in this cell's output, and return the display
    handles of its outputs so they can be emptied later.

    Inline: no CDN is reachable offline, and in Colab each output is its own page, so BokehJS
    must travel with the chart. Bokeh publishes it without a display id; for the duration of
    the call its publisher is swapped for one that keeps a handle (restored in ``finally``).
    """
    import bokeh.io
    import bokeh.io.notebook as bokeh_notebook
    import bokeh.resources
    from IPython.display import display

    handles: list[Any] = []

    def publish(data: dict[str, Any], metadata: Any = None, **_: Any) -> None:
        handles.append(display(data, metadata=metadata, raw=True, display_id=True))

    original = bokeh_notebook.publish_display_data
    bokeh_notebook.publish_display_data = publish  # type: ignore[assignment]
    try:
        bokeh.io.output_notebook(bokeh.resources.INLINE, hide_banner=True)
    finally:
        bokeh_notebook.publish_display_data = original  # type: ignore[assignment]
    return [h for h in handles if h is not None]


class LiveView:
    """Live charts of a running :class:`traceml_nb.Run`, updated by one background thread.

    ``tick_s``: seconds between updates (default 0.5; at least 0.25: at most 4 a second), longer
    when a tick's own work took more than ``max_duty`` of them (at most ``MAX_TICK_S``).
    ``display``: show the widget in the notebook; ``False`` builds it and sends its updates
    without showing it (benchmarks, tests). ``analysis_interval_s`` and ``analysis_max_duty``:
    the running verdict is recomputed at most that often, and takes at most that share of one
    core (:mod:`.verdict` says what the header shows).

    Counters for the cost measurement: ``updates`` (ticks that sent something), ``messages``
    (comm messages sent to the frontend), ``ticks``, ``busy_s`` (CPU seconds the view spent
    updating, writer thread plus the final update, including the engine's turning the run's
    step log into rows when the view asks for them: ``reading_s``), ``analysis_busy_s`` (the
    part of it spent computing the running verdict).
    """

    def __init__(
        self,
        run: Run,
        *,
        tick_s: float = DEFAULT_TICK_S,
        display: bool = True,
        max_points: int = MAX_POINTS,
        settle_s: float = SETTLE_S,
        analysis_interval_s: float = ANALYSIS_MIN_INTERVAL_S,
        analysis_max_duty: float = ANALYSIS_MAX_DUTY,
        max_duty: float = VIEW_MAX_DUTY,
    ) -> None:
        self.run = run
        self.max_duty = max_duty
        self.analysis_interval_s = analysis_interval_s
        self.analysis_max_duty = analysis_max_duty
        self.settle_s = settle_s
        self.tick_s = max(float(tick_s), MIN_TICK_S)
        self.display = display
        self.max_points = max_points
        self.widget: BatchedBokehModel | None = None
        self._bokehjs: list[Any] = []  # display handles of the BokehJS outputs
        self.charts: LiveCharts | None = None
        self.rank_lines: RankLines | None = None  #: the ranks the run launched, on the charts
        self.ticks = 0
        self.updates = 0
        self.busy_s = 0.0
        self.reading_s = 0.0  #: the part of ``busy_s`` spent getting the new step rows
        self.analysis_busy_s = 0.0  #: the part of ``busy_s`` spent on the running verdict
        self.error: str | None = None
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.step_series = StepSeries(self._read_rows, max_points)
        self._rate_history: deque[tuple[float, int]] = deque()
        self.verdict = RunningVerdict()
        self._analyze: Callable[[RecordSnapshot, Capabilities], Analysis] | None = None
        self._analysis_failed = False
        self._analysis_errors = 0
        self._next_analysis = 0.0
        self._started_at = 0.0
        self._followed = ""  # the rank the header's steps/s follow

    @property
    def messages(self) -> int:
        """Comm messages sent to the frontend so far."""
        return self.widget.sent_messages if self.widget is not None else 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, *, background: bool = True) -> None:
        """Show the charts and start the writer thread; a failure is noted, never raised.
        ``background=False`` starts no thread: the caller updates the view with :meth:`tick`
        (tests that follow the view tick by tick)."""
        if self._thread is not None or self._stopped or self.widget is not None:
            return
        try:
            self._start(background)
        except Exception as exc:
            self._fail("live view failed to start", exc)

    def _start(self, background: bool) -> None:
        if self.display:
            self._bokehjs = load_bokehjs_inline()
        charts = LiveCharts(self.run, self.max_points)
        self.charts = charts
        self.rank_lines = RankLines(self.run, charts, self.max_points)
        charts.header.text = self._header()
        self.widget = BatchedBokehModel(charts.layout)
        if self.display:
            from IPython.display import display

            display(self.widget)
        self._started_at = time.monotonic()
        if background:
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread, then send the final points. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)
            if thread.is_alive():
                self.run.capabilities.note(
                    "live view thread did not stop within 5 s; left as a daemon"
                )
                return
            self._thread = None
        if self.widget is not None and self.error is None:
            self.tick(final=True)
        self._drop_bokehjs()

    def _drop_bokehjs(self) -> None:
        """Empty the ~4 MB BokehJS outputs once the run is over: the page keeps the library
        it already ran, and the saved notebook stays small (the static report is the record)."""
        handles, self._bokehjs = self._bokehjs, []
        for handle in handles:
            try:
                handle.update({"text/plain": ""}, raw=True)
            except Exception as exc:
                self._fail("the BokehJS output could not be emptied", exc)

    def close(self) -> None:
        """Stop, then remove the widget from the page (and its comm)."""
        self.stop()
        if self.widget is not None:
            try:
                self.widget.close()
            except Exception as exc:
                self._fail("live view could not be closed", exc)

    # --- the writer thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        with self.run.reading():  # this thread asks for the step rows: the loop only logs
            due = time.monotonic() + min(self.tick_s, MIN_TICK_S)  # the first points soon
            while not self._stop_event.wait(min(max(0.0, due - time.monotonic()), READ_EVERY_S)):
                if time.monotonic() < due:  # between ticks: only the reading
                    c0 = time.thread_time()
                    self._catch_up()
                    self.busy_s += time.thread_time() - c0
                    continue
                busy_s, reading_s = self.busy_s, self.reading_s
                if not self.tick():
                    return
                own_s = (self.busy_s - busy_s) - (self.reading_s - reading_s)
                due = time.monotonic() + tick_wait_s(own_s, self.tick_s, self.max_duty)

    def _catch_up(self) -> None:
        """The run's step log turned into rows now (``reading_s``)."""
        with self._reading():
            self.run.catch_up()

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """The block's thread CPU counts as the engine's work of turning the log into rows
        (``reading_s``), not the view's own."""
        c0 = time.thread_time()
        try:
            yield
        finally:
            self.reading_s += time.thread_time() - c0

    def _read_rows(self, row: int) -> RecordSnapshot:
        """The run's step rows from ``row`` on, brought up to date first (``reading_s``)."""
        with self._reading():
            return self.run.snapshot(row, samples=False)

    def tick(self, *, final: bool = False) -> bool:
        """One update (``final``: the last, after the run); False (and the error noted) when it
        failed and the view must stop."""
        c0 = time.thread_time()
        try:
            self._update(final)
            return True
        except Exception as exc:
            self._fail("live view stopped updating", exc)
            return False
        finally:
            self.ticks += 1
            self.busy_s += time.thread_time() - c0

    def _fail(self, what: str, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        try:
            self.run.capabilities.note(f"{what}: {self.error}")
        except Exception:
            pass

    def _update(self, final: bool) -> None:
        charts = self.charts
        widget = self.widget
        assert charts is not None and widget is not None
        sent_before = widget.sent_messages
        # When the verdict is due, one copy of the whole record feeds the chart, the step count
        # and the analysis alike: all three say the same rows. The rows are brought up to date
        # first, so that the engine's work is counted as such (``reading_s``), not as the view's.
        snapshot = None
        if self._analysis_due(final):
            self._catch_up()
            snapshot = self.run.snapshot()
        with widget.batch():
            upd = self.step_series.update(final=final, snapshot=snapshot)
            if upd is not None:
                charts.choose_rate_field(upd)
                self._apply(charts.steps, upd)
                if self.step_series.has_phases and not self.rank_lines:
                    charts.show_phases(self.step_series.phases_seen)
            for series, source in charts.sample_series:
                upd = series.update(final=final)
                if upd is not None:
                    self._apply(source, upd)
            ranks = self.rank_lines
            if ranks is not None:
                for source, upd in ranks.update(final=final):
                    self._apply(source, upd)
            title = self._step_title()
            if charts.step_fig.title.text != title:
                charts.step_fig.title.text = title
            if snapshot is not None:
                self._analyse(snapshot, final)
            text = self._header(final)
            if text != charts.header.text:
                charts.header.text = text
        if widget.sent_messages != sent_before:
            self.updates += 1

    def _step_title(self) -> str:
        """The step chart's title: the ranks' once the run launched some, else the run's own;
        with the steps a point stands for once that is more than one."""
        ranks = self.rank_lines
        own = PHASES_STEP_TITLE if self.charts and self.charts.phases_shown else OWN_STEP_TITLE
        title, k = (STEP_TITLE, ranks.k) if ranks else (own, self.step_series.k)
        return title + (f" (median per {k} steps)" if k > 1 else "")

    def _apply(self, source: ColumnDataSource, update: SeriesUpdate) -> None:
        """Send ``update`` to ``source`` (only the columns the source holds)."""
        new = {name: update.data[name] for name in source.column_names}
        if update.replace:
            source.data = {name: _as_float32(values) for name, values in new.items()}
        elif self._settling() and points_of(source) + len(update) <= SETTLE_MAX_POINTS:
            held = source.data
            source.data = {
                name: np.concatenate([_as_float32(held[name]), _as_float32(values)])
                for name, values in new.items()
            }
        else:
            source.stream(  # type: ignore[arg-type]
                {name: _on_the_wire(values) for name, values in new.items()},
                rollover=self.max_points,
            )

    def _settling(self) -> bool:
        return time.monotonic() - self._started_at < self.settle_s

    # --- header -------------------------------------------------------------------------------
    def _header(self, final: bool = False) -> str:
        run = self.run
        elapsed = run.elapsed_s
        steps = self.step_series.steps
        status = "running" if not final else str(run.status)
        verdict = self.verdict.text(steps, running=not final)
        rank = ""
        followed = slowest_parts(self.rank_lines.figures()) if self.rank_lines else None
        if followed is not None:  # the header follows the slowest rank
            figures, rank, verdict = followed
            steps = self.rank_lines.steps_of(figures) if self.rank_lines else 0
            if self._followed != rank:
                self._followed = rank
                self._rate_history.clear()
        history = self._rate_history
        history.append((elapsed, steps))
        while len(history) > 2 and history[1][0] <= elapsed - RATE_WINDOW_S:
            history.popleft()
        rate = recent_rate(list(history))
        mfu, at_least = self.verdict.mfu, self.verdict.mfu_at_least
        return header_html(run.name, status, steps, elapsed, rate, verdict, rank, mfu, at_least)

    def _analysis_due(self, final: bool) -> bool:
        """The running verdict is recomputed at most every ``analysis_interval_s`` (and less
        often when the analysis is slow, so that it takes at most ``analysis_max_duty`` of one
        core), once there can be enough steady steps, and at the end."""
        if self._analysis_failed or self.rank_lines:  # the ranks' figures are the verdict
            return False
        if final:
            return True
        enough = self.step_series.steps >= MIN_STEADY_STEPS
        return enough and time.monotonic() >= self._next_analysis

    def _analyse(self, snapshot: RecordSnapshot, final: bool) -> None:
        """The analysis of ``snapshot`` into the running verdict; a failure is survived."""
        if self._analyze is None:
            try:
                from ...analysis import analyze
            except Exception:
                self._analysis_failed = True
                return
            self._analyze = analyze
        c0 = time.thread_time()
        try:
            self.verdict.update(self._analyze(snapshot, self.run.capabilities), final=final)
            self._analysis_errors = 0
        except Exception as exc:
            # the record is read while it grows: one failure may be a passing state of it
            self._analysis_errors += 1
            if final:
                self.verdict = RunningVerdict()  # the last word must not be a stale verdict
            if self._analysis_errors >= ANALYSIS_MAX_ERRORS:
                self._analysis_failed = True
                self.verdict = RunningVerdict()
                self.run.capabilities.note(
                    f"running verdict unavailable: {type(exc).__name__}: {exc}"
                )
        spent = time.thread_time() - c0
        self.analysis_busy_s += spent
        interval = max(self.analysis_interval_s, spent / self.analysis_max_duty)
        self._next_analysis = time.monotonic() + interval
