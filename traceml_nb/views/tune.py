"""``%traceml tune``: the live table while it measures, and the report when it ends.

Under a rich frontend one output, a display handle, is updated in place at most
``MAX_UPDATES_PER_S`` times a second (the table and a progress bar); its last state is the
static report, so a saved notebook shows it. In a terminal each candidate is printed as one
line when it has been measured, then the report. Values that were not measured say why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape
from typing import Any

from ..analysis.formatting import fmt_ms, fmt_s, fmt_share, signed_pct
from ..tune.predict import (
    DROPPED,
    FAILED,
    MEASURED,
    MEASURING,
    NOT_MEASURED,
    PENDING,
    SKIPPED,
    Measurement,
    TuneResult,
)

MAX_UPDATES_PER_S = 4.0
COLUMNS = (
    "candidate",
    "status",
    "start-up",
    "between batches",
    "training side",
    "worker CPU",
    "predicted step",
    "note",
)


def _startup(m: Measurement) -> str:
    if m.startup_s is None:
        return "\u2014"
    return fmt_ms(m.startup_s * 1e3) if m.candidate.num_workers else "none (no workers)"


def _worker_cpu(m: Measurement) -> str:
    if not m.candidate.num_workers:
        return "\u2014"
    if m.worker_cpu_share is None:
        return f"unavailable ({m.worker_cpu_why})" if m.worker_cpu_why else "\u2014"
    return f"{fmt_share(m.worker_cpu_share)} of a core each"


def _predicted(m: Measurement, result: TuneResult) -> str:
    if m.predicted_ms is not None:
        return fmt_ms(m.predicted_ms)
    if m.between_ms is None:
        return "\u2014"
    why = result.unavailable.get("compute_ms", "no compute time")
    return f"unavailable ({why})"


def row_cells(m: Measurement, result: TuneResult) -> list[str]:
    """The cells of one candidate's row, in :data:`COLUMNS` order."""
    status = m.status
    if status == MEASURED and result.recommended == m.candidate and result.status != "running":
        status = "recommended"
    if m.candidate == result.current:
        status += " (the run's setting)"
    measured = m.between_ms is not None
    return [
        m.candidate.label,
        status,
        _startup(m),
        f"{fmt_ms(m.between_ms)} ({m.steady_batches} batches)" if measured else "\u2014",
        fmt_ms(m.training_side_ms) if measured else "\u2014",
        _worker_cpu(m),
        _predicted(m, result),
        m.reason,
    ]


def _ordered(result: TuneResult) -> list[Measurement]:
    """Measured candidates by predicted time (then cost), then the others in their order."""
    measured = [m for m in result.measurements if m.between_ms is not None]
    key = {id(m): (m.predicted_ms or m.between_ms or 0.0, m.candidate.cost) for m in measured}
    measured.sort(key=lambda m: key[id(m)])
    rest = [m for m in result.measurements if m.between_ms is None]
    return measured + rest


def summary_lines(result: TuneResult) -> list[str]:
    """The sentences under the title: the recommendation, the line to paste, the saving."""
    lines = [result.headline()]
    if result.paste:
        lines.append(f"paste: {result.paste}")
    saving = result.saving_share
    if saving is not None and result.run_step_ms is not None and result.predicted_ms is not None:
        if saving > 0:
            lines.append(
                f"predicted saving: {fmt_share(saving)} of the step time "
                f"({fmt_ms(result.run_step_ms)} \u2192 {fmt_ms(result.predicted_ms)})"
            )
        else:
            lines.append(
                f"no saving predicted: the run's {fmt_ms(result.run_step_ms)} a step is as fast "
                f"as the best candidate ({signed_pct(-saving)})"
            )
    elif "compute_ms" in result.unavailable:
        lines.append(
            "predicted step time unavailable ("
            f"{result.unavailable['compute_ms']}): ranked by the time between batches"
        )
    return lines


def title(result: TuneResult) -> str:
    who = f" of {result.run_label}" if result.run_label else ""
    state = {"running": "measuring", "completed": "done"}.get(result.status, result.status)
    return f"traceml tune{who}: {state}, {result.progress_text()}"


def render_text(result: TuneResult) -> str:
    lines = [title(result)]
    if result.status != "running":
        lines += [f"  {line}" for line in summary_lines(result)]
    rows = [list(COLUMNS)] + [row_cells(m, result) for m in _ordered(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)] + [r[-1]]
        lines.append("  " + "  ".join(cells).rstrip())
    if result.status != "running":
        lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(lines)


_STATUS_COLOUR = {
    "recommended": "#1a7f37",
    MEASURED: "inherit",
    MEASURING: "#0969da",
    PENDING: "#888",
    DROPPED: "#888",
    SKIPPED: "#9a6700",
    FAILED: "#cf222e",
    NOT_MEASURED: "#888",
}


def render_html(result: TuneResult) -> str:
    done = sum(m.status not in (PENDING, MEASURING) for m in result.measurements)
    total = max(len(result.measurements), 1)
    share = min(1.0, max(done / total, result.elapsed_s / max(result.budget_s, 1e-9)))
    if result.status != "running":
        share = 1.0
    bar = (
        '<div style="background:#eee;width:320px;height:6px;margin:4px 0">'
        f'<div style="background:#0969da;width:{share * 100:.0f}%;height:6px"></div></div>'
    )
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{escape(c)}</th>" for c in COLUMNS)
    body = []
    for m in _ordered(result):
        cells = row_cells(m, result)
        key = cells[1].split(" (")[0]
        colour = _STATUS_COLOUR.get(key, "inherit")
        tds = "".join(f"<td style='padding:2px 8px'>{escape(c)}</td>" for c in cells)
        body.append(f"<tr style='color:{colour}'>{tds}</tr>")
    summary = ""
    if result.status != "running":
        items = summary_lines(result)
        summary = f"<p><b>{escape(items[0])}</b></p>"
        if result.paste:
            summary += f"<pre style='margin:4px 0'>{escape(result.paste)}</pre>"
        summary += "".join(f"<p style='margin:2px 0'>{escape(x)}</p>" for x in items[2:])
    notes = ""
    if result.status != "running" and result.notes:
        notes = "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in result.notes) + "</ul>"
    return (
        '<div class="traceml-tune" style="font-family:system-ui,sans-serif;font-size:12px">'
        f"<b>{escape(title(result))}</b>{bar}{summary}"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{notes}"
        "</div>"
    )


@dataclass
class TuneReport:
    """A tuning as a display object: HTML and text say the same."""

    result: TuneResult

    def _repr_html_(self) -> str:
        return render_html(self.result)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(render_text(self.result))

    def __repr__(self) -> str:
        return render_text(self.result)


class TuneLiveView:
    """Shows a tuning while it runs: ``update(result)`` as the tuner's progress callback,
    ``finish(result)`` at the end. ``rich``: one display handle updated in place; else one
    printed line per candidate measured, then the report."""

    def __init__(self, rich: bool) -> None:
        self.rich = rich
        self.updates = 0
        self._handle: Any = None
        self._last = 0.0
        self._printed: set[int] = set()

    def update(self, result: TuneResult) -> None:
        if self.rich:
            now = time.monotonic()
            if self._handle is not None and now - self._last < 1 / MAX_UPDATES_PER_S:
                return
            self._last = now
            self._publish(result)
            return
        if not self._printed and not self.updates:
            print(title(result).rsplit(":", 1)[0] + ": measuring DataLoader candidates")
            self.updates += 1
        for m in result.measurements:
            if id(m) not in self._printed and m.status not in (PENDING, MEASURING):
                self._printed.add(id(m))
                cells = row_cells(m, result)
                why = f" ({cells[7]})" if cells[7] else ""
                print(
                    f"  {cells[0]}: {cells[1]}{why}; between batches {cells[3]}, "
                    f"predicted step {cells[6]} [{fmt_s(result.elapsed_s)}]"
                )

    def _publish(self, result: TuneResult) -> None:
        from IPython.display import display

        report = TuneReport(result)
        if self._handle is None:
            self._handle = display(report, display_id=True)
        else:
            self._handle.update(report)
        self.updates += 1

    def finish(self, result: TuneResult) -> None:
        if self.rich:
            self._publish(result)
        else:
            print(render_text(result))
