"""The end-of-run report: one display object with an HTML and a ``text/plain`` version.

The report is a static artefact: plain HTML with inline styles and an inline SVG chart drawn
here, no JavaScript and no widget, so the saved notebook shows it in nbviewer, on GitHub and
when it is opened again. Rendering is pure: :class:`Report` holds the inputs (run facts, the
analysis, the comparisons, the capabilities, the step series for the chart) and
:func:`render_html` / :func:`~.text.render_text` turn them into strings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ..analysis.model import Analysis
from ..capabilities import Capabilities
from ..history import history_cells
from .text import (
    format_ms,
    format_seconds,
    format_value,
    metric_lines,
    render_comparison_text,
    render_text,
    run_label,
    saving_sentence,
    status_sentence,
    steps_phrase,
)

#: Most bars the static chart draws; longer runs are averaged into this many buckets.
MAX_BARS = 400

WAIT_COLOUR = "#e8833a"
COMPUTE_COLOUR = "#4c78a8"
VERDICT_COLOURS = {
    "input-bound": "#d9480f",
    "host-bound": "#7048e8",
    "compute-bound": "#2b8a3e",
    "throttled": "#c92a2a",
    "memory-pressure": "#c92a2a",
    "insufficient-data": "#868e96",
}
#: ``Comparison.verdict`` and ``ComparisonRow.direction`` values, coloured green / red.
GOOD_DIRECTIONS = {"good", "faster"}
BAD_DIRECTIONS = {"bad", "slower"}


@dataclass
class RunMeta:
    """Facts about the run itself (not measurements)."""

    name: str
    status: str  #: "completed", "failed" or "interrupted"
    error: str | None = None  #: "ValueError: boom" for a failed run
    elapsed_s: float = 0.0  #: wall time of the run, seconds
    device: str = "cpu"  #: "cpu" or "cuda:N"
    run_id: int | None = None  #: number in the session history (``%traceml history``)


@dataclass
class StepChart:
    """Per-step times of the measured phase, in step order, for the static chart.

    ``wall_ms`` is each step's duration and ``data_wait_ms`` the part of it spent waiting for
    the DataLoader, both in milliseconds; the first ``warmup_steps`` steps are warm-up.
    """

    wall_ms: list[float]
    data_wait_ms: list[float]
    warmup_steps: int = 0


@dataclass
class LabelledComparison:
    """A comparison with an earlier run; ``title`` names it, e.g. ``previous run #1 baseline``."""

    title: str
    comparison: Any  #: traceml_nb.analysis.compare's Comparison (rows, verdict, headline)


@dataclass
class Report:
    """Everything the final report shows; displays itself as HTML and as plain text."""

    meta: RunMeta
    analysis: Analysis
    capabilities: Capabilities
    comparisons: list[LabelledComparison] = field(default_factory=list)
    chart: StepChart | None = None
    notes: list[str] = field(default_factory=list)

    def _repr_html_(self) -> str:
        return render_html(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(render_text(self))

    def __repr__(self) -> str:
        return render_text(self)


# --- the chart -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bars:
    """The chart's bars: mean step time and mean data wait (ms) of consecutive step buckets."""

    wall_ms: list[float]
    data_wait_ms: list[float]
    steps_per_bar: float  #: average number of steps behind one bar
    first_step: list[int]  #: 1-based number of each bar's first step


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def downsample(
    wall_ms: Sequence[float], data_wait_ms: Sequence[float], max_bars: int = MAX_BARS
) -> Bars:
    """Average consecutive steps into at most ``max_bars`` buckets of near-equal size.

    Means (not medians) so that a bar's area stays proportional to the time it stands for.
    """
    n = len(wall_ms)
    bars = min(n, max_bars)
    walls: list[float] = []
    waits: list[float] = []
    firsts: list[int] = []
    for b in range(bars):
        lo, hi = b * n // bars, (b + 1) * n // bars
        walls.append(_mean(wall_ms[lo:hi]))
        waits.append(_mean(data_wait_ms[lo:hi]))
        firsts.append(lo + 1)
    return Bars(walls, waits, n / bars if bars else 0.0, firsts)


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k that is ≥ ``value``."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for mult in (1, 2, 2.5, 5, 10):
        top = mult * 10**exp
        if top >= value * (1 - 1e-9):
            return float(top)
    return float(10 ** (exp + 1))


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def step_chart_svg(
    chart: StepChart, *, width: int = 720, height: int = 190, max_bars: int = MAX_BARS
) -> str:
    """An inline SVG of step time split into data wait and the rest of the step, per step.

    Bars above 3× the 95th percentile (a slow first batch, say) are clipped to keep the
    steady steps readable; a clipped bar gets a dark cap and the caption says so.
    """
    bars = downsample(chart.wall_ms, chart.data_wait_ms, max_bars)
    n_bars = len(bars.wall_ms)
    if n_bars == 0:
        return ""
    left, right, top, bottom = 56, 8, 26, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    tallest = max((v for v in bars.wall_ms if not math.isnan(v)), default=0.0)
    typical = _quantile(bars.wall_ms, 0.95)
    clip = tallest > 3 * typical > 0
    y_max = _nice_ceiling(1.5 * typical if clip else tallest)
    base = top + plot_h

    def y(ms: float) -> float:
        return base - min(ms, y_max) / y_max * plot_h

    slot = plot_w / n_bars
    bar_w = slot * 0.8 if slot >= 6 else slot
    wait_path: list[str] = []
    rest_path: list[str] = []
    caps: list[str] = []
    for i, (wall, wait) in enumerate(zip(bars.wall_ms, bars.data_wait_ms, strict=True)):
        if math.isnan(wall):
            continue
        x = left + i * slot
        wait = 0.0 if math.isnan(wait) else min(wait, wall)
        y_wait, y_wall = y(wait), y(wall)
        if wait > 0:
            wait_path.append(f"M{x:.1f} {base:.1f}V{y_wait:.1f}h{bar_w:.1f}V{base:.1f}Z")
        rest_path.append(f"M{x:.1f} {y_wait:.1f}V{y_wall:.1f}h{bar_w:.1f}V{y_wait:.1f}Z")
        if wall > y_max:
            caps.append(f"M{x:.1f} {top:.1f}h{bar_w:.1f}v3h{-bar_w:.1f}Z")

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">',
        "<title>Step time per step: data wait and the rest of the step</title>",
    ]
    warmup_bars = _bars_covering(bars, chart.warmup_steps)
    if warmup_bars:
        x_end = left + warmup_bars * slot
        parts.append(
            f'<rect x="{left}" y="{top}" width="{x_end - left:.1f}" height="{plot_h}" '
            'fill="#888888" fill-opacity="0.15"/>'
            f'<text x="{left + 3}" y="{top + 11}" fill="#777777">warm-up</text>'
        )
    parts.append(
        f'<path d="{"".join(rest_path)}" fill="{COMPUTE_COLOUR}" shape-rendering="crispEdges"/>'
    )
    if wait_path:
        parts.append(
            f'<path d="{"".join(wait_path)}" fill="{WAIT_COLOUR}" shape-rendering="crispEdges"/>'
        )
    if caps:
        parts.append(f'<path d="{"".join(caps)}" fill="#222222"/>')
    # axes, ticks and labels
    parts.append(
        f'<path d="M{left} {top}V{base}H{left + plot_w}" stroke="#888888" fill="none"/>'
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" fill="#777777">'
        f"{format_ms(y_max)}</text>"
        f'<text x="{left - 4}" y="{top + plot_h / 2 + 4:.1f}" text-anchor="end" fill="#777777">'
        f"{format_ms(y_max / 2)}</text>"
        f'<text x="{left - 4}" y="{base + 4}" text-anchor="end" fill="#777777">0</text>'
        f'<text x="{left}" y="{height - 6}" fill="#777777">step 1</text>'
        f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end" fill="#777777">'
        f"step {len(chart.wall_ms):,}</text>"
    )
    legend = (
        f'<rect x="{left}" y="6" width="10" height="10" fill="{WAIT_COLOUR}"/>'
        f'<text x="{left + 14}" y="15" fill="#777777">data wait</text>'
        f'<rect x="{left + 80}" y="6" width="10" height="10" fill="{COMPUTE_COLOUR}"/>'
        f'<text x="{left + 94}" y="15" fill="#777777">rest of the step</text>'
    )
    note = []
    if bars.steps_per_bar > 1:
        note.append(f"each bar: mean of {bars.steps_per_bar:.1f} steps")
    if clip:
        note.append(f"bars above {format_ms(y_max)} clipped")
    if note:
        legend += (
            f'<text x="{left + plot_w}" y="15" text-anchor="end" fill="#777777">'
            f"{escape('; '.join(note))}</text>"
        )
    parts.append(legend)
    parts.append("</svg>")
    return "".join(parts)


def _bars_covering(bars: Bars, steps: int) -> int:
    """How many bars hold the first ``steps`` steps (a bar counts when it starts inside)."""
    return sum(1 for first in bars.first_step if first <= steps) if steps > 0 else 0


# --- the HTML --------------------------------------------------------------------------------
_BOX = (
    "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.45;"
    "max-width:900px;border:1px solid rgba(128,128,128,0.4);border-radius:6px;padding:8px 14px;"
)
_MUTED = "opacity:0.7;"
_TABLE = "border-collapse:collapse;margin:4px 0;font-size:inherit;"
_TD = "padding:1px 12px 1px 0;text-align:left;vertical-align:top;"


def _list(title: str, items: Sequence[str]) -> str:
    if not items:
        return ""
    lis = "".join(f"<li>{escape(item)}</li>" for item in items)
    return f'<div><b>{escape(title)}</b><ul style="margin:2px 0 4px 0">{lis}</ul></div>'


def _badge(verdict: str) -> str:
    colour = VERDICT_COLOURS.get(verdict, "#495057")
    return (
        f'<span style="background:{colour};color:#ffffff;border-radius:4px;padding:1px 7px;'
        f'font-weight:600">{escape(verdict)}</span>'
    )


def _direction_style(direction: Any) -> str:
    text = str(direction).lower()
    if text in GOOD_DIRECTIONS:
        return "color:#2b8a3e;"
    if text in BAD_DIRECTIONS:
        return "color:#c92a2a;"
    return ""


def _comparison_html(title: str, comp: Any) -> str:
    rows = []
    for label, before, after, delta, direction in comp.rows:
        rows.append(
            f'<tr><td style="{_TD}">{escape(str(label))}</td>'
            f'<td style="{_TD}">{escape(format_value(before))}</td>'
            f'<td style="{_TD}">{escape(format_value(after))}</td>'
            f'<td style="{_TD}{_direction_style(direction)}">'
            f"{escape(format_value(delta))}</td></tr>"
        )
    table = ""
    if rows:
        head = "".join(
            f'<th style="{_TD}{_MUTED}">{h}</th>' for h in ("", "before", "after", "change")
        )
        table = f'<table style="{_TABLE}"><tr>{head}</tr>{"".join(rows)}</table>'
    return (
        f'<div style="margin-top:6px"><b>{escape(title)}</b>: '
        f'<span style="{_direction_style(comp.verdict)}">{escape(comp.headline)}</span>'
        f"{table}</div>"
    )


def render_html(report: Report) -> str:
    """The report as one self-contained HTML fragment (inline styles and SVG, no script)."""
    meta, summary, diagnosis = report.meta, report.analysis.summary, report.analysis.diagnosis
    out = [f'<div class="traceml-report" style="{_BOX}">']
    out.append(
        f'<div style="{_MUTED}"><b>traceml</b> · {escape(run_label(meta))} · '
        f"{escape(meta.status)} in {format_seconds(meta.elapsed_s)} · "
        f"{escape(steps_phrase(summary))} · {escape(meta.device)}</div>"
    )
    warning = status_sentence(meta.status, meta.error, summary)
    if warning:
        out.append(
            '<div style="background:#fff3cd;color:#664d03;border-radius:4px;padding:3px 8px;'
            f'margin:4px 0">{escape(warning)}</div>'
        )
    out.append(
        f'<div style="margin:6px 0 2px 0;font-size:15px">{_badge(diagnosis.verdict)} '
        f"<b>{escape(diagnosis.title)}</b> "
        f'<span style="{_MUTED}font-size:12px">'
        f"({escape(diagnosis.confidence)} confidence)</span></div>"
    )
    if diagnosis.cause:
        out.append(f"<div>Cause: {escape(diagnosis.cause)}</div>")
    out.append(_list("Evidence", [f"{e.label}: {e.text}" for e in diagnosis.evidence]))
    out.append(_list("Advice", diagnosis.advice))
    out.append(_list("Will not help", diagnosis.wont_help))
    saving = saving_sentence(diagnosis.saving_text, diagnosis.saving_bound_share)
    if saving:
        out.append(f"<div><b>Saving bound:</b> {escape(saving)}</div>")
    out.append(_list("Also", diagnosis.secondary))
    out.extend(_comparison_html(f"vs {item.title}", item.comparison) for item in report.comparisons)
    if report.chart is not None and report.chart.wall_ms:
        out.append(f'<div style="margin-top:6px">{step_chart_svg(report.chart)}</div>')
    metrics = "".join(
        f'<tr><td style="{_TD}{_MUTED}">{escape(m.label)}</td>'
        f'<td style="{_TD}">{escape(m.text)}</td></tr>'
        for m in metric_lines(summary, report.capabilities)
    )
    phases = "".join(
        f'<tr><td style="{_TD}{_MUTED}">{escape(p.name)}</td>'
        f'<td style="{_TD}">{p.batches:,} batches, {format_seconds(p.total_s)}</td></tr>'
        for p in summary.phases
    )
    out.append(f'<table style="{_TABLE}">{metrics}{phases}</table>')
    if report.notes:
        out.append(_list("Notes", report.notes))
    out.append("</div>")
    return "".join(part for part in out if part)


# --- %traceml history and %traceml compare -----------------------------------------------------
@dataclass
class HistoryTable:
    """``%traceml history``: ``rows`` from ``history_table`` as HTML, ``text`` as plain text."""

    rows: list[dict[str, Any]]
    text: str

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<div>{escape(self.text)}</div>"
        cells = [history_cells(row) for row in self.rows]
        head = "".join(f'<th style="{_TD}">{escape(col)}</th>' for col in cells[0])
        body = "".join(
            "<tr>" + "".join(f'<td style="{_TD}">{escape(v)}</td>' for v in row.values()) + "</tr>"
            for row in cells
        )
        return f'<table class="traceml-history" style="{_TABLE}"><tr>{head}</tr>{body}</table>'

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)

    def __repr__(self) -> str:
        return self.text


@dataclass
class ComparisonView:
    """``%traceml compare A B``: run ``after`` against run ``before``."""

    before_label: str  #: e.g. "#1 baseline"
    after_label: str
    comparison: Any

    @property
    def title(self) -> str:
        return f"{self.after_label} vs {self.before_label}"

    def _repr_html_(self) -> str:
        body = _comparison_html(self.title, self.comparison)
        return f'<div class="traceml-compare" style="{_BOX}">{body}</div>'

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def __repr__(self) -> str:
        return render_comparison_text(self.title, self.comparison)
