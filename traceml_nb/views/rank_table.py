"""The report's ranks section: one row per rank, the straggler and the job's throughput, as
the same cells for the text and the HTML version (pure: data in, strings out)."""

from __future__ import annotations

from html import escape

from ..analysis.formatting import fmt_ms, fmt_rate, fmt_share
from ..analysis.stragglers import RanksSummary

#: The columns of the ranks table.
HEADER = ("rank", "status", "steps", "step (median)", "data wait share", "throughput")


def _or_unavailable(value: float | None, render: str) -> str:
    return render if value is not None else "unavailable"


def rank_rows(ranks: RanksSummary) -> list[tuple[str, ...]]:
    """One row of cells per rank, in :data:`HEADER` order."""
    rows: list[tuple[str, ...]] = []
    for f in ranks.ranks:
        straggler = ranks.straggler
        mark = (
            " (straggler)"
            if straggler and (straggler.launch, straggler.rank) == (f.launch, f.rank)
            else ""
        )
        rows.append(
            (
                f.label + mark,
                f.status,
                f"{f.steps:,}",
                _or_unavailable(f.step_ms_median, fmt_ms(f.step_ms_median)),
                _or_unavailable(f.data_wait_share, fmt_share(f.data_wait_share)),
                _or_unavailable(f.samples_per_s, fmt_rate(f.samples_per_s, "samples/s")),
            )
        )
    return rows


def sentences(ranks: RanksSummary) -> list[str]:
    """The straggler (or that none stands out), the job's throughput, the time in
    collectives, the ranks that did not complete."""
    out = []
    if ranks.straggler is not None:
        out.append(f"Straggler: {ranks.straggler.evidence}.")
    elif len([f for f in ranks.ranks if f.step_ms_median is not None]) >= 2:
        out.append("No straggler: no rank's step time or data wait stands out.")
    if ranks.samples_per_s is not None:
        out.append(f"Job throughput: {fmt_rate(ranks.samples_per_s, 'samples/s')} (all ranks).")
    out.append(f"Time in collectives: unavailable ({ranks.collectives}).")
    out += [f"Partial: {line}." for line in ranks.failures]
    return out


def ranks_text(ranks: RanksSummary) -> list[str]:
    """The section as plain-text lines."""
    rows = [HEADER, *rank_rows(ranks)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(HEADER))]
    lines = [f"Ranks ({len(ranks.ranks)}):"]
    lines += [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    ]
    lines += [f"  {s}" for s in sentences(ranks)]
    return lines


_TD = "padding:1px 12px 1px 0;text-align:left;vertical-align:top;"


def ranks_html(ranks: RanksSummary) -> str:
    """The section as an HTML fragment (inline styles)."""
    head = "".join(f'<th style="{_TD}">{escape(h)}</th>' for h in HEADER)
    body = "".join(
        "<tr>" + "".join(f'<td style="{_TD}">{escape(c)}</td>' for c in row) + "</tr>"
        for row in rank_rows(ranks)
    )
    said = "".join(f"<div>{escape(s)}</div>" for s in sentences(ranks))
    return (
        f'<div style="margin-top:6px"><b>Ranks ({len(ranks.ranks)})</b>'
        f'<table style="border-collapse:collapse;margin:4px 0;font-size:inherit">'
        f"<tr>{head}</tr>{body}</table>{said}</div>"
    )
