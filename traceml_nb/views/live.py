"""The live view: Bokeh charts under the running cell, fed by one writer thread.

::

    view = LiveView(run)   # run: a started traceml_nb.Run
    view.start()           # BokehJS inline + the charts; the "traceml-view" thread starts
    ...                    # training
    view.stop()            # joins the thread, sends the final points

Cost rules: one writer thread; at most 4 ticks per second, fewer when the view's own work
would take more than ``VIEW_MAX_DUTY`` of a core (a slow machine); each tick
reads only the rows added since the last one, turns them into at most one update per chart
source (:mod:`.live_data`: batched, downsampled, bounded) and sends *all* of the tick's
changes as one Bokeh ``PATCH-DOC`` message (three comm messages), so the frontend gets at
most 12 messages per second whatever the step rate. The view never writes to the record and
never raises into the user's cell: a failure stops the view and is noted in the run's
capabilities.
"""

from __future__ import annotations

import html
import threading
import time
from collections import deque
from typing import Any

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource
from bokeh.models.widgets.markups import Div
from bokeh.plotting import figure

from ..analysis.thresholds import MIN_STEADY_STEPS
from .bokeh_patch import BatchedBokehModel
from .live_data import (
    MAX_POINTS,
    RATE_WINDOW_STEPS,
    SampleSeries,
    SeriesUpdate,
    StepSeries,
    recent_rate,
)
from .live_verdict import RunningVerdict, plural

THREAD_NAME = "traceml-view"
MIN_TICK_S = 0.25  #: at most 4 ticks per second
#: Seconds between updates by default: 2 a second keep the charts live at half the cost of 4
#: (the budget is 1% of the run time, and a run of a few seconds spends much of it settling).
#: The first update comes after ``MIN_TICK_S``.
DEFAULT_TICK_S = 0.5
#: The view's own work (the copies, the charts' messages, the running verdict; not the engine's
#: turning of the step log into rows, which the run needs with or without a view) takes at most
#: this share of one core: a tick that cost more puts the next one off, up to ``MAX_TICK_S``.
VIEW_MAX_DUTY = 0.005
MAX_TICK_S = 2.0  #: ...so that the charts never stand still longer than this
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

FIG_WIDTH = 460
FIG_HEIGHT = 210
WAIT_COLOR = "#e6550d"
COMPUTE_COLOR = "#3182bd"
CPU_COLORS = {"proc_cpu_pct": "#3182bd", "workers_cpu_pct": "#e6550d", "sys_cpu_pct": "#969696"}
#: The step series' columns the charts use (``step_ms`` is not drawn: it is not sent).
STEP_CHART_FIELDS = ("step", "t_s", "wait_ms", "compute_ms", "samples_per_s", "steps_per_s")
HOST_COLUMNS = ("proc_cpu_pct", "workers_cpu_pct", "sys_cpu_pct")
GPU_COLUMNS = ("util_gpu_pct", "mem_used_mb", "torch_alloc_mb")
GPU_COLORS = (
    "#31a354",
    "#756bb1",
    "#e6550d",
    "#3182bd",
    "#636363",
    "#de2d26",
    "#fd8d3c",
    "#6baed6",
)


def _unavailable_box(text: str) -> Div:
    return Div(
        text=f'<div class="traceml-unavailable">{html.escape(text)}</div>',
        width=FIG_WIDTH,
        height=FIG_HEIGHT,
        styles={
            "border": "1px dashed #bbb",
            "color": "#555",
            "padding": "12px",
            "font-size": "13px",
            "box-sizing": "border-box",
        },
    )


def _figure(title: str, x_label: str, y_label: str) -> Any:
    fig: Any = figure(
        title=title,
        width=FIG_WIDTH,
        height=FIG_HEIGHT,
        tools="pan,box_zoom,wheel_zoom,reset,save",
        toolbar_location="right",
    )
    fig.xaxis.axis_label = x_label
    fig.yaxis.axis_label = y_label
    fig.title.text_font_size = "12px"
    fig.axis.axis_label_text_font_size = "11px"
    fig.toolbar.logo = None
    return fig


def _finish_legend(fig: Any) -> None:
    """One compact horizontal legend above the plot, where it hides no data."""
    legend = fig.legend[0]
    fig.center = [obj for obj in fig.center if obj is not legend]
    legend.orientation = "horizontal"
    legend.location = "top_left"
    legend.label_text_font_size = "10px"
    legend.glyph_height = 10
    legend.glyph_width = 14
    legend.label_height = 10
    legend.padding = 0
    legend.margin = 2
    legend.spacing = 8
    legend.border_line_alpha = 0
    fig.add_layout(legend, "above")


class LiveCharts:
    """The Bokeh models of the live view and the sources that feed them."""

    def __init__(self, run: Any, max_points: int = MAX_POINTS) -> None:
        rec = run.record
        caps = run.capabilities
        self.header = Div(text="", width=2 * FIG_WIDTH, styles={"font-size": "13px"})
        self.steps = ColumnDataSource(_empty(STEP_CHART_FIELDS))

        self.step_fig = _figure("Step time: data wait + compute", "step", "ms")
        self.step_fig.varea_stack(
            ["wait_ms", "compute_ms"],
            x="step",
            source=self.steps,
            color=[WAIT_COLOR, COMPUTE_COLOR],
            fill_alpha=0.75,
            legend_label=["data wait", "compute (rest of the step)"],
        )
        _finish_legend(self.step_fig)

        self.rate_fig = _figure("Throughput", "seconds since the start", "samples/s")
        self.rate_line = self.rate_fig.line(
            "t_s",
            "samples_per_s",
            source=self.steps,
            color=COMPUTE_COLOR,
            legend_label=f"mean over the last {RATE_WINDOW_STEPS}+ steps",
        )
        _finish_legend(self.rate_fig)
        self.rate_field_chosen = False

        #: (series, the chart source it feeds), one per sample table shown
        self.sample_series: list[tuple[SampleSeries, ColumnDataSource]] = []
        self.host: ColumnDataSource | None = None
        if rec.host is not None:
            self.host_series = SampleSeries(rec.host, HOST_COLUMNS, max_points)
            self.host = ColumnDataSource(_empty(self.host_series.names))
            cpu: Any = _figure("CPU utilisation", "seconds since the start", "% (100 = one core)")
            labels = {
                "proc_cpu_pct": "this process",
                "workers_cpu_pct": "DataLoader workers",
                "sys_cpu_pct": "system (100 = all cores)",
            }
            for name, label in labels.items():
                if name in rec.host.names:
                    cpu.line(
                        "t", name, source=self.host, color=CPU_COLORS[name], legend_label=label
                    )
            if cpu.legend:
                _finish_legend(cpu)
            self.sample_series.append((self.host_series, self.host))
        else:
            cpu = _unavailable_box(f"CPU unavailable: {caps.why('host')}")

        self.gpus: dict[int, ColumnDataSource] = {}
        gpu_models: list[Any] = []
        if rec.gpus:
            util = _figure("GPU utilisation", "seconds since the start", "%")
            mem = _figure("GPU memory", "seconds since the start", "MB")
            for n, (index, table) in enumerate(sorted(rec.gpus.items())):
                series = SampleSeries(table, GPU_COLUMNS, max_points)
                src = ColumnDataSource(_empty(series.names))
                self.gpus[index] = src
                self.sample_series.append((series, src))
                color = GPU_COLORS[n % len(GPU_COLORS)]
                if "util_gpu_pct" in table.names:
                    util.line(
                        "t", "util_gpu_pct", source=src, color=color, legend_label=f"GPU {index}"
                    )
                if "mem_used_mb" in table.names:
                    mem.line(
                        "t",
                        "mem_used_mb",
                        source=src,
                        color=color,
                        legend_label=f"GPU {index} used (NVML)",
                    )
                if "torch_alloc_mb" in table.names:
                    mem.line(
                        "t",
                        "torch_alloc_mb",
                        source=src,
                        color=color,
                        line_dash="dashed",
                        legend_label=f"GPU {index} allocated (PyTorch)",
                    )
            for fig in (util, mem):
                if fig.legend:
                    _finish_legend(fig)
            if not caps.ok("gpu_utilisation") and caps.why("gpu_utilisation"):
                util.title.text = f"GPU utilisation unavailable: {caps.why('gpu_utilisation')}"
            gpu_models = [util, mem]
        else:
            gpu_models = [_unavailable_box(f"GPU unavailable: {caps.why('nvml')}")]

        rows = [row(self.step_fig, self.rate_fig), row(cpu, gpu_models[0])]
        if len(gpu_models) > 1:
            rows.append(row(gpu_models[1]))
        self.layout = column(self.header, *rows)

    def choose_rate_field(self, update: SeriesUpdate) -> None:
        """Plot samples/s when batch sizes are known, else steps/s (decided on the first data)."""
        if self.rate_field_chosen or not len(update):
            return
        self.rate_field_chosen = True
        if np.isnan(update.data["samples_per_s"][0]):  # the batch size could not be read
            renderer = self.rate_line
            for glyph in (renderer.glyph, renderer.nonselection_glyph, renderer.muted_glyph):
                if glyph is not None:
                    glyph.y = "steps_per_s"
            self.rate_fig.yaxis.axis_label = "steps/s"


def tick_wait_s(own_s: float, tick_s: float, max_duty: float = VIEW_MAX_DUTY) -> float:
    """Seconds until the next tick after one whose own work took ``own_s`` CPU seconds: the
    usual ``tick_s``, or long enough that the view's work stays within ``max_duty`` of a core,
    but never past ``MAX_TICK_S`` (nor below ``tick_s``)."""
    return max(tick_s, min(own_s / max_duty, MAX_TICK_S))


def _empty(names: Any) -> dict[str, np.ndarray]:
    return {name: np.empty(0, dtype=np.float32) for name in names}


def _as_float32(values: Any) -> np.ndarray:
    """float32 is plenty for a chart and halves the bytes sent."""
    return np.asarray(values, dtype=np.float32)


def _on_the_wire(values: np.ndarray) -> Any:
    """A few values go as a JSON list (cheaper to encode than an array), more as float32."""
    if len(values) <= SMALL_UPDATE_POINTS:
        return values.tolist()
    return _as_float32(values)


def _points(source: ColumnDataSource) -> int:
    return len(next(iter(source.data.values()), []))


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


def header_html(
    name: str,
    status: str,
    steps: int,
    elapsed_s: float,
    steps_per_s: float | None,
    verdict: str,
) -> str:
    """The header line: run name, status, step count, elapsed seconds, recent steps/s, and the
    verdict part (:meth:`~.live_verdict.RunningVerdict.text`; '' for none)."""
    rate = f"{steps_per_s:,.1f} steps/s" if steps_per_s is not None else "– steps/s"
    parts = [
        f'<b class="traceml-name">{html.escape(name)}</b>',
        f'<span class="traceml-status">{html.escape(status)}</span>',
        f'<span class="traceml-steps">{plural(steps, "step")}</span>',
        f'<span class="traceml-elapsed">{elapsed_s:,.1f} s</span>',
        f'<span class="traceml-rate">{rate}</span>',
    ]
    if verdict:
        parts.append(f'<span class="traceml-verdict">{html.escape(verdict)}</span>')
    return '<div class="traceml-live-header">' + " · ".join(parts) + "</div>"


class LiveView:
    """Live charts of a running :class:`traceml_nb.Run`, updated by one background thread.

    ``tick_s``: seconds between updates (default 0.5; at least 0.25: at most 4 a second), longer
    when a tick's own work took more than ``max_duty`` of them (at most ``MAX_TICK_S``).
    ``display``: show the widget in the notebook; ``False`` builds it and sends its updates
    without showing it (benchmarks, tests). ``analysis_interval_s`` and ``analysis_max_duty``:
    the running verdict is recomputed at most that often, and takes at most that share of one
    core (:mod:`.live_verdict` says what the header shows).

    Counters for the cost measurement: ``updates`` (ticks that sent something), ``messages``
    (comm messages sent to the frontend), ``ticks``, ``busy_s`` (CPU seconds the view spent
    updating, writer thread plus the final update, including the engine's turning the run's
    step log into rows when the view asks for them: ``reading_s``), ``analysis_busy_s`` (the
    part of it spent computing the running verdict).
    """

    def __init__(
        self,
        run: Any,
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
        self._analyze: Any = None
        self._analysis_failed = False
        self._analysis_errors = 0
        self._next_analysis = 0.0
        self._started_at = 0.0

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
            wait = min(self.tick_s, MIN_TICK_S)  # the first points as soon as allowed
            while not self._stop_event.wait(wait):
                busy_s, reading_s = self.busy_s, self.reading_s
                if not self.tick():
                    return
                own_s = (self.busy_s - busy_s) - (self.reading_s - reading_s)
                wait = tick_wait_s(own_s, self.tick_s, self.max_duty)

    def _read_rows(self, row: int) -> Any:
        """The run's step rows from ``row`` on, brought up to date first (``reading_s``)."""
        c0 = time.thread_time()
        try:
            return self.run.snapshot(row, samples=False)
        finally:
            self.reading_s += time.thread_time() - c0

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
        # and the analysis alike: all three say the same rows.
        snapshot = self.run.snapshot() if self._analysis_due(final) else None
        with widget.batch():
            upd = self.step_series.update(final=final, snapshot=snapshot)
            if upd is not None:
                charts.choose_rate_field(upd)
                self._apply(charts.steps, upd)
                title = "Step time: data wait + compute"
                if self.step_series.k > 1:
                    title += f" (median per {self.step_series.k} steps)"
                if charts.step_fig.title.text != title:
                    charts.step_fig.title.text = title
            for series, source in charts.sample_series:
                upd = series.update(final=final)
                if upd is not None:
                    self._apply(source, upd)
            if snapshot is not None:
                self._analyse(snapshot, final)
            text = self._header(final)
            if text != charts.header.text:
                charts.header.text = text
        if widget.sent_messages != sent_before:
            self.updates += 1

    def _apply(self, source: ColumnDataSource, update: SeriesUpdate) -> None:
        """Send ``update`` to ``source`` (only the columns the source holds)."""
        new = {name: update.data[name] for name in source.column_names}
        if update.replace:
            source.data = {name: _as_float32(values) for name, values in new.items()}
        elif self._settling() and _points(source) + len(update) <= SETTLE_MAX_POINTS:
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
        history = self._rate_history
        history.append((elapsed, steps))
        while len(history) > 2 and history[1][0] <= elapsed - RATE_WINDOW_S:
            history.popleft()
        rate = recent_rate(list(history))
        status = "running" if not final else str(run.status)
        verdict = self.verdict.text(steps, running=not final)
        return header_html(run.name, status, steps, elapsed, rate, verdict)

    def _analysis_due(self, final: bool) -> bool:
        """The running verdict is recomputed at most every ``analysis_interval_s`` (and less
        often when the analysis is slow, so that it takes at most ``analysis_max_duty`` of one
        core), once there can be enough steady steps, and at the end."""
        if self._analysis_failed:
            return False
        if final:
            return True
        enough = self.step_series.steps >= MIN_STEADY_STEPS
        return enough and time.monotonic() >= self._next_analysis

    def _analyse(self, snapshot: Any, final: bool) -> None:
        """The analysis of ``snapshot`` into the running verdict; a failure is survived."""
        if self._analyze is None:
            try:
                from ..analysis import analyze
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
