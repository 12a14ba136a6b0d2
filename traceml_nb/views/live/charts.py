"""The Bokeh models of the live view: the header, the step-time, throughput, CPU and GPU charts
and the chart sources that feed them (:class:`LiveCharts`), and the header's HTML.

Building only: :mod:`.view` decides what goes into the sources and when.
"""

from __future__ import annotations

import html
from collections.abc import Collection
from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource
from bokeh.models.widgets.markups import Div
from bokeh.plotting import figure

from ...analysis.formatting import fmt_share, plural
from ...engine.run import Run
from .data import MAX_POINTS, RATE_WINDOW_STEPS, SeriesUpdate
from .sample_series import SampleSeries

#: The CPU chart's label of this process's children, and what it becomes once ranks start.
WORKERS_LABEL = "DataLoader workers"
RANKS_CPU_LABEL = "the ranks (child processes)"
#: The step chart's title for the run's own steps, and once their phases are known.
OWN_STEP_TITLE = "Step time: data wait + compute"
PHASES_STEP_TITLE = "Step time: data wait + phases (timed on sampled steps)"
FIG_WIDTH = 460
FIG_HEIGHT = 210
WAIT_COLOR = "#e6550d"
COMPUTE_COLOR = "#3182bd"
#: The step chart's legend entry of the input copy (shown, as each phase's, once it took time).
COPY_LABEL = "input copy"
#: The step chart's layers, bottom up: (column, legend label, colour). The rest of the step is
#: "compute" until a step's phases are known, then what the phases leave of it ("other").
STEP_LAYERS = (
    ("wait_ms", "data wait", WAIT_COLOR),
    ("other_ms", "compute (rest of the step)", COMPUTE_COLOR),
    ("copy_ms", COPY_LABEL, "#969696"),
    ("forward_ms", "forward", "#31a354"),
    ("backward_ms", "backward", "#756bb1"),
    ("optimizer_ms", "optimizer", "#e7ba52"),
)
#: The rest's label once the phases are known.
OTHER_LABEL = "other"
CPU_COLORS = {"proc_cpu_pct": "#3182bd", "workers_cpu_pct": "#e6550d", "sys_cpu_pct": "#969696"}
#: The step series' columns the charts use (``step_ms`` and ``compute_ms`` are not drawn: they
#: are not sent).
STEP_CHART_FIELDS = (
    "step",
    "t_s",
    "samples_per_s",
    "steps_per_s",
    *(column for column, _, _ in STEP_LAYERS),
)
HOST_COLUMNS = ("proc_cpu_pct", "workers_cpu_pct", "sys_cpu_pct")
GPU_COLUMNS = ("util_gpu_pct", "sm_active_pct", "mem_used_mb", "torch_alloc_mb")
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

    def __init__(self, run: Run, max_points: int = MAX_POINTS) -> None:
        rec = run.record
        caps = run.capabilities
        self.header = Div(text="", width=2 * FIG_WIDTH, styles={"font-size": "13px"})
        self.steps = ColumnDataSource(_empty(STEP_CHART_FIELDS))

        self.step_fig = _figure(OWN_STEP_TITLE, "step", "ms")
        self.step_fig.varea_stack(
            [column for column, _, _ in STEP_LAYERS],
            x="step",
            source=self.steps,
            color=[color for _, _, color in STEP_LAYERS],
            fill_alpha=0.75,
            legend_label=[label for _, label, _ in STEP_LAYERS],
        )
        _finish_legend(self.step_fig)
        for item in self.step_fig.legend[0].items[2:]:
            item.visible = False  # until a step's phases are known: :meth:`show_phases`
        self.phases_shown = False

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

        self.cpu_fig: Any = None
        #: (series, the chart source it feeds), one per sample table shown
        self.sample_series: list[tuple[SampleSeries, ColumnDataSource]] = []
        self.host: ColumnDataSource | None = None
        if rec.host is not None:
            self.host_series = SampleSeries(rec.host, HOST_COLUMNS, max_points)
            self.host = ColumnDataSource(_empty(self.host_series.names))
            cpu: Any = _figure("CPU utilisation", "seconds since the start", "% (100 = one core)")
            labels = {
                "proc_cpu_pct": "this process",
                "workers_cpu_pct": WORKERS_LABEL,
                "sys_cpu_pct": "system (100 = all cores)",
            }
            for name, label in labels.items():
                if name in rec.host.names:
                    cpu.line(
                        "t", name, source=self.host, color=CPU_COLORS[name], legend_label=label
                    )
            if cpu.legend:
                _finish_legend(cpu)
            self.cpu_fig = cpu
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
                if "sm_active_pct" in table.names and caps.ok("gpm_sm_active"):
                    # a GPM value every GPM_PERIOD_S, the samples between have none: dots
                    util.scatter(
                        "t",
                        "sm_active_pct",
                        source=src,
                        color=color,
                        size=5,
                        legend_label=f"GPU {index} SM activity (GPM)",
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

    def show_phases(self, seen: Collection[str]) -> None:
        """The rest of the step called what it now is (what the phases leave of it: their areas
        draw from the first step whose phases are known), and the legend entries of the phases
        ``seen`` (their columns: those that took time in a timed step). A phase never seen has
        no entry, not one of 0 ms: the input copy of a loop that iterates no DataLoader, the
        forward of a model the hooks cannot see, the backward and optimizer of an evaluation."""
        items = self.step_fig.legend[0].items
        if not self.phases_shown:
            self.phases_shown = True
            for item in items:
                if item.label.value == STEP_LAYERS[1][1]:
                    item.label = value(OTHER_LABEL)
        labels = {label for field, label, _ in STEP_LAYERS[2:] if field in seen}
        for item in items[2:]:
            if item.label.value in labels:
                item.visible = True

    def make_room_for_ranks(self) -> None:
        """Before the first rank's lines: the CPU of this process's children is the ranks' (and
        their DataLoader workers'); the legends keep only the ranks' entries while the run's own
        loop has no steps (the process that launched the ranks only waits)."""
        if self.cpu_fig is not None and self.cpu_fig.legend:
            for item in self.cpu_fig.legend[0].items:
                if item.label.value == WORKERS_LABEL:
                    item.label = value(RANKS_CPU_LABEL)
        if points_of(self.steps):
            return
        for fig in (self.step_fig, self.rate_fig):
            fig.legend[0].items = []
        self.rate_field_chosen = True  # the ranks choose it (.rank_figures)

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


def _empty(names: Any) -> dict[str, np.ndarray]:
    return {name: np.empty(0, dtype=np.float32) for name in names}


def points_of(source: ColumnDataSource) -> int:
    """The points ``source`` holds."""
    return len(next(iter(source.data.values()), []))


def header_html(
    name: str,
    status: str,
    steps: int,
    elapsed_s: float,
    steps_per_s: float | None,
    verdict: str,
    rank: str = "",
    mfu: float | None = None,
    mfu_at_least: bool = False,
) -> str:
    """The header line: run name, status, step count, elapsed seconds, recent steps/s, the
    MFU where known (0..1; None: not shown; ``mfu_at_least``: a lower bound, read "at least",
    as the report reads it) and the verdict part (:meth:`~.verdict.RunningVerdict.text`; ''
    for none). ``rank``: for a run that launched ranks, the rank whose steps and steps/s these
    are (''; none)."""
    rate = f"{steps_per_s:,.1f} steps/s" if steps_per_s is not None else "– steps/s"
    parts = [
        f'<b class="traceml-name">{html.escape(name)}</b>',
        f'<span class="traceml-status">{html.escape(status)}</span>',
        *([f'<span class="traceml-rank">{html.escape(rank)}</span>'] if rank else []),
        f'<span class="traceml-steps">{plural(steps, "step")}</span>',
        f'<span class="traceml-elapsed">{elapsed_s:,.1f} s</span>',
        f'<span class="traceml-rate">{rate}</span>',
    ]
    if mfu is not None:
        bound = "at least " if mfu_at_least else ""
        parts.append(f'<span class="traceml-mfu">MFU {bound}{fmt_share(mfu)}</span>')
    if verdict:
        parts.append(f'<span class="traceml-verdict">{html.escape(verdict)}</span>')
    return '<div class="traceml-live-header">' + " · ".join(parts) + "</div>"
