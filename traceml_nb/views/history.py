"""``%traceml history``: the session's runs as a table, one plain row a run, shown as text or HTML."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..analysis.formatting import fmt_ms, fmt_pct, fmt_rate, fmt_s, fmt_share, signed_pct
from ..session.history import History

NO_RUNS = "No traceml_nb runs in this session yet."


def history_table(history: History) -> list[dict[str, Any]]:
    """One plain dict per run, oldest first, for the text and HTML renderers.

    Keys: ``id``, ``label``, ``name``, ``status``, ``started_at`` (epoch s), ``started``
    (HH:MM:SS local), ``elapsed_s``, ``total_steps`` (every step the loop made, as the report
    counts them), ``steady_steps``, ``step_ms_median``, ``samples_per_s``,
    ``data_wait_share``, ``gpu_util_median_pct``, ``gpu_mem_peak_mb``, ``verdict``, ``cause``,
    ``previous_id`` (the earlier run of the same cell, or None) and ``step_change`` (median step
    time relative to it, e.g. -0.43; None without a previous run).
    """
    rows = []
    for e in history.entries:
        s = e.summary
        prev = history.previous_of(e)
        change = None
        if prev is not None and prev.summary.step_ms_median and s.step_ms_median is not None:
            change = s.step_ms_median / prev.summary.step_ms_median - 1
        rows.append(
            {
                "id": e.id,
                "label": e.label,
                "name": e.name,
                "status": e.status,
                "started_at": e.started_at,
                "started": time.strftime("%H:%M:%S", time.localtime(e.started_at)),
                "elapsed_s": e.elapsed_s,
                "total_steps": s.total_steps,
                "steady_steps": s.steady_steps,
                "step_ms_median": s.step_ms_median,
                "samples_per_s": s.samples_per_s,
                "data_wait_share": s.data_wait_share,
                "gpu_util_median_pct": s.gpu_util_median_pct,
                "gpu_mem_peak_mb": s.gpu_mem_peak_mb,
                "verdict": e.diagnosis.verdict,
                "cause": e.diagnosis.cause,
                "previous_id": prev.id if prev is not None else None,
                "step_change": change,
            }
        )
    return rows


def history_cells(row: dict[str, Any]) -> dict[str, str]:
    """One row of :func:`history_table` as the cells shown (text and HTML alike), keyed by
    column title; unavailable values are a dash, never 0."""

    def maybe(value: Any, fmt: Callable[[Any], str]) -> str:
        return "\u2014" if value is None else fmt(value)

    vs = ""
    if row.get("previous_id") is not None and row.get("step_change") is not None:
        vs = f"{signed_pct(row['step_change'])} vs #{row['previous_id']}"
    return {
        "run": str(row["label"]),
        "status": str(row["status"]),
        "started": str(row["started"]),
        "time": fmt_s(row["elapsed_s"]),
        "steps": f"{row['total_steps']:,}",
        "step": maybe(row.get("step_ms_median"), fmt_ms),
        "throughput": maybe(row.get("samples_per_s"), lambda v: fmt_rate(v, "samples/s")),
        "data wait": maybe(row.get("data_wait_share"), fmt_share),
        "GPU util": maybe(row.get("gpu_util_median_pct"), fmt_pct),
        "verdict": str(row["verdict"]),
        "vs": vs,
    }


def history_text(history: History) -> str:
    """``%traceml history`` as plain text: a fixed-width table, oldest run first."""
    rows = [history_cells(r) for r in history_table(history)]
    if not rows:
        return NO_RUNS
    lines = [tuple(rows[0]), *(tuple(r.values()) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    if history.dropped:
        text.append(
            f"({history.dropped} older runs dropped: the history keeps the last {history.max_runs})"
        )
    return "\n".join(text)
