"""The final report, ``%traceml compare`` and ``%traceml history`` as HTML fragments: inline
styles and SVG, no script, so a saved notebook shows them on GitHub, in nbviewer and when it is
opened again. Pure: data in, strings out; the same sentences as the text version (:mod:`.text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..analysis.comparison import Comparison
from ..analysis.formatting import fmt_s
from ..analysis.profile_summary import ProfileSummary
from ..tune.prediction import Prediction
from . import profile_section as profile_view
from .chart import step_chart_svg
from .comparison_words import headline
from .comparison_words import rows as comparison_rows
from .diagnosis_words import diagnosis_words
from .rank_table import ranks_html
from .report_content import ReportContent
from .text import (
    format_value,
    metric_lines,
    phase_text,
    run_label,
    status_sentence,
    steps_phrase,
)

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


def _direction_style(direction: str | None) -> str:
    text = str(direction).lower()
    if text in GOOD_DIRECTIONS:
        return "color:#2b8a3e;"
    if text in BAD_DIRECTIONS:
        return "color:#c92a2a;"
    return ""


def comparison_html(title: str, comp: Comparison, prediction: Prediction | None = None) -> str:
    """``title: headline``, what changed and the rows of ``comp`` (and of a tuning's
    ``prediction``)."""
    rows = []
    for label, before, after, delta, direction in comparison_rows(comp, prediction):
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
    note = getattr(comp, "note", "")
    head = f'<div style="{_MUTED}">{escape(note)}</div>' if note else ""
    changes = list(getattr(comp, "changes", []) or [])
    changed = ""
    if changes:
        items = "".join(f"<li>{escape(line)}</li>" for line in changes[1:])
        changed = f"<div>What changed: {escape(changes[0])}</div>" + (
            f'<ul style="margin:0 0 0 18px;padding:0">{items}</ul>' if items else ""
        )
    said = escape(headline(comp, prediction))
    return (
        f'<div style="margin-top:6px">{head}<b>{escape(title)}</b>: '
        f'<span style="{_direction_style(comp.verdict)}">{said}</span>'
        f"{changed}{table}</div>"
    )


def render_html(report: ReportContent) -> str:
    """The report as one self-contained HTML fragment (inline styles and SVG, no script)."""
    if report.job_line:
        return f'<div class="traceml-report" style="{_BOX}">{escape(report.job_line)}</div>'
    meta, summary, diagnosis = report.meta, report.analysis.summary, report.analysis.diagnosis
    out = [f'<div class="traceml-report" style="{_BOX}">']
    out.append(
        f'<div style="{_MUTED}"><b>traceml</b> · {escape(run_label(meta))} · '
        f"{escape(meta.status)} in {fmt_s(meta.elapsed_s)} · "
        f"{escape(steps_phrase(summary))} · {escape(meta.device)}</div>"
    )
    warning = status_sentence(meta.status, meta.error, summary)
    if warning:
        out.append(
            '<div style="background:#fff3cd;color:#664d03;border-radius:4px;padding:3px 8px;'
            f'margin:4px 0">{escape(warning)}</div>'
        )
    words = diagnosis_words(diagnosis)
    out.append(
        f'<div style="margin:6px 0 2px 0;font-size:15px">{_badge(diagnosis.verdict)} '
        f"<b>{escape(words.title)}</b> "
        f'<span style="{_MUTED}font-size:12px">'
        f"({escape(words.confidence)} confidence)</span></div>"
    )
    if words.cause:
        out.append(f"<div>Cause: {escape(words.cause)}</div>")
    if words.profiled_cause:
        out.append(f"<div><b>Profile:</b> {escape(words.profiled_cause)}</div>")
    out.append(_list("Evidence", words.evidence))
    out.append(_list("Advice", words.advice))
    out.append(_list("Will not help", words.wont_help))
    if words.saving:
        out.append(f"<div><b>Saving bound:</b> {escape(words.saving)}</div>")
    out.append(_list("Also", words.also))
    if report.cost_text:
        out.append(f"<div>{escape(report.cost_text)}</div>")
    if report.ranks is not None:
        out.append(ranks_html(report.ranks))
    out.extend(
        comparison_html(f"vs {item.title}", item.comparison, item.prediction)
        for item in report.comparisons
    )
    if report.chart is not None and report.chart.wall_ms:
        out.append(f'<div style="margin-top:6px">{step_chart_svg(report.chart)}</div>')
    metrics = "".join(
        f'<tr><td style="{_TD}{_MUTED}">{escape(m.label)}</td>'
        f'<td style="{_TD}">{escape(m.text)}</td></tr>'
        for m in metric_lines(summary, report.capabilities)
    )
    phases = "".join(
        f'<tr><td style="{_TD}{_MUTED}">{escape(p.name)}</td>'
        f'<td style="{_TD}">{escape(phase_text(p))}</td></tr>'
        for p in summary.phases
    )
    out.append(f'<table style="{_TABLE}">{metrics}{phases}</table>')
    if report.profile is not None:
        out.append(profile_html(report.profile))
    if report.notes:
        out.append(_list("Notes", report.notes))
    out.append("</div>")
    return "".join(part for part in out if part)


def profile_html(profile: ProfileSummary) -> str:
    """The profile section: the top operators by host and by GPU time, then its facts."""
    out = [f'<div style="margin-top:6px"><b>{escape(profile_view.heading(profile))}</b></div>']
    for title, rows in profile_view.op_tables(profile):
        head = "".join(
            f'<th style="{_TD}{_MUTED}">{h}</th>'
            for h in (f"top operators {title}", "share", "a step", "calls a step", "where")
        )
        body = "".join(
            "<tr>"
            + "".join(
                f'<td style="{_TD}">{escape(v)}</td>'
                for v in (r.name, r.share, r.per_step, r.calls, r.where)
            )
            + "</tr>"
            for r in rows
        )
        out.append(f'<table style="{_TABLE}"><tr>{head}</tr>{body}</table>')
    out.append(_list("", profile_view.facts(profile)))
    return "".join(part for part in out if part)


def compare_html(title: str, comparison: Comparison) -> str:
    """``%traceml compare A B`` as HTML: the headline and the table of changes."""
    return f'<div class="traceml-compare" style="{_BOX}">{comparison_html(title, comparison)}</div>'


def history_html(cells: Sequence[dict[str, str]], empty_text: str) -> str:
    """``%traceml history`` as an HTML table of ``cells`` (:func:`.history.history_cells` of each
    run); ``empty_text`` when there is no run."""
    if not cells:
        return f"<div>{escape(empty_text)}</div>"
    head = "".join(f'<th style="{_TD}">{escape(col)}</th>' for col in cells[0])
    body = "".join(
        "<tr>" + "".join(f'<td style="{_TD}">{escape(v)}</td>' for v in row.values()) + "</tr>"
        for row in cells
    )
    return f'<table class="traceml-history" style="{_TABLE}"><tr>{head}</tr>{body}</table>'
