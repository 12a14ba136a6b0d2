"""``%traceml history``: the session's runs as a table, one plain row a run, shown as text or HTML."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..analysis.comparison import batch_sizes_differ
from ..analysis.formatting import fmt_ms, fmt_pct, fmt_rate, fmt_s, fmt_share, signed_pct
from ..analysis.variants import ARGUMENT_NAMES, ARGUMENTS, is_argument
from ..session.history import History
from ..session.store import Store
from ..session.store_rows import NameTotals, StoredRow
from ..session.stored_jobs import split_jobs
from .diagnosis_words import cause_words

if TYPE_CHECKING:
    from ..session.shifts import NameShifts

NO_RUNS = "No traceml_nb runs in this session yet."


def history_table(history: History) -> list[dict[str, Any]]:
    """One plain dict per run, oldest first, for the text and HTML renderers.

    Keys: ``id``, ``label``, ``name``, ``status``, ``started_at`` (epoch s), ``started``
    (HH:MM:SS local), ``elapsed_s``, ``total_steps`` (every step the loop made, as the report
    counts them), ``steady_steps``, ``step_ms_median``, ``samples_per_s``,
    ``data_wait_share``, ``gpu_util_median_pct``, ``gpu_mem_peak_mb``, ``verdict``, ``cause``,
    ``previous_id`` (the earlier run of the same cell, or None), ``step_change`` (median step
    time relative to it, e.g. -0.43; None without a previous run) and ``per_sample`` (the
    change is of the time per sample: the two runs' batch sizes differ).
    """
    rows = []
    for e in history.entries:
        s = e.summary
        prev = history.previous_of(e)
        change, per_sample = None, False
        if prev is not None and prev.summary.step_ms_median and s.step_ms_median is not None:
            change = s.step_ms_median / prev.summary.step_ms_median - 1
            per_sample = batch_sizes_differ((prev.summary.batch_size, s.batch_size))
            if per_sample:
                size_ratio = (s.batch_size or 1) / (prev.summary.batch_size or 1)
                change = (change + 1) / size_ratio - 1
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
                "cause": cause_words(e.diagnosis.cause),
                "previous_id": prev.id if prev is not None else None,
                "step_change": change,
                "per_sample": per_sample,
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
        unit = " a sample" if row.get("per_sample") else ""
        vs = f"{signed_pct(row['step_change'])}{unit} vs #{row['previous_id']}"
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


# --- %traceml history --all / --name: the stored runs of every session -------------------------
#: ``%traceml history --all`` shows the latest this many stored runs (the totals count all).
STORED_ROWS = 100
#: The idle-GPU totals cover the runs of the last this many days.
TOTALS_DAYS = 7


def stored_cells(row: StoredRow) -> dict[str, str]:
    """One :class:`~traceml_nb.session.store_rows.StoredRow` as the cells shown, by column title."""

    def maybe(value: Any, fmt: Callable[[Any], str]) -> str:
        return "\u2014" if value is None else fmt(value)

    idle = "\u2014"
    if row.idle_gpu_s is not None:
        idle = f"{row.idle_gpu_s / 60:.1f} GPU-min"
        if row.idle_cost_usd is not None:
            idle += f" \u2248 ${row.idle_cost_usd:.2f}"
    return {
        "run": f"@{row.id} {row.name}",
        "status": str(row.status),
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(row.started_at)),
        "time": fmt_s(row.elapsed_s),
        "steps": maybe(row.total_steps, lambda v: f"{v:,}"),
        "step": maybe(row.step_ms_median, fmt_ms),
        "data wait": maybe(row.data_wait_share, fmt_share),
        "GPU util": maybe(row.gpu_util_median_pct, fmt_pct),
        "verdict": str(row.verdict or "\u2014"),
        "hardware": str(row.hardware),
        "GPU idle": idle,
    }


def group_jobs(rows: list[StoredRow]) -> list[list[StoredRow]]:
    """Stored rows in order, the runs of one ``torchrun`` job together, at the place of the
    job's first run, in rank order: the jobs of each name as
    :func:`~traceml_nb.session.stored_jobs.split_jobs` tells them apart (a rank that stores
    again under the same id starts another job)."""
    by_name: dict[str, list[StoredRow]] = {}
    for row in rows:
        if getattr(row, "job_id", None) is not None:
            by_name.setdefault(row.name, []).append(row)
    job_of = {  # split_jobs keeps the rows it is given: a job's runs are StoredRows here
        id(r): cast(list[StoredRow], job.runs)
        for runs in by_name.values()
        for job in split_jobs(runs)
        for r in job.runs
    }
    groups: list[list[StoredRow]] = []
    shown: set[int] = set()  # the jobs already placed, by id of their list of runs
    for row in rows:
        group = job_of.get(id(row), [row])
        if id(group) not in shown:
            shown.add(id(group))
            groups.append(group)
    return groups


def job_cells(rows: list[StoredRow]) -> dict[str, str]:
    """One row for a job's runs (:func:`group_jobs`): its ranks' ids, the worst status, the
    figures per rank in rank order (``24 / 24``), the slowest rank's median step."""
    if len(rows) == 1 and getattr(rows[0], "job_id", None) is None:
        return stored_cells(rows[0])
    cells = [stored_cells(r) for r in rows]
    first = rows[0]
    failed = [f"rank {r.rank}" for r in rows if r.status != "completed"]
    world = first.world_size
    ranks = (
        f"{len(rows)} of {world} ranks" if world and world != len(rows) else f"{len(rows)} ranks"
    )
    steps = [r.step_ms_median for r in rows if r.step_ms_median is not None]
    out = dict(cells[0])
    out["run"] = f"{' '.join(f'@{r.id}' for r in rows)} {first.name} (job, {ranks})"
    out["status"] = "completed" if not failed else f"failed ({', '.join(failed)})"
    out["started"] = cells[0]["started"]
    out["time"] = fmt_s(max(r.elapsed_s for r in rows))
    for key in ("steps", "data wait", "GPU util"):
        out[key] = " / ".join(c[key] for c in cells)
    out["step"] = fmt_ms(max(steps)) if steps else "\u2014"
    out["verdict"] = " / ".join(dict.fromkeys(c["verdict"] for c in cells))
    return out


def given_cell(history: NameShifts, run_id: int, seen: dict[str, list[str]]) -> str:
    """The values of :attr:`NameShifts.split_by` run ``run_id`` was given: a number as written
    (``HIDDEN 512``), a hash as the order of its first run (``--model #2``: the values are not
    stored), an argument another run gave and this one did not as ``no --fp16``; an arrow
    marks the runs of the series (given the latest run's values)."""
    values = history.given.get(run_id, {})
    parts = []
    named = any(is_argument(n) and n not in (ARGUMENTS, ARGUMENT_NAMES) for n in history.split_by)
    for name in history.split_by:
        if name == ARGUMENT_NAMES or (name == ARGUMENTS and named):
            continue
        label = "arguments" if name == ARGUMENTS else name
        value = values.get(name)
        if value is None:
            if ARGUMENT_NAMES in values and is_argument(name):
                parts.append(f"no {label}")
            continue
        if is_argument(name) or value.startswith("str:"):
            order = seen.setdefault(name, [])
            if value not in order:
                order.append(value)
            value = f"#{order.index(value) + 1}"
        parts.append(f"{label} {value}")
    mark = " ←" if any(r.id == run_id for r in history.runs) else ""
    return (", ".join(parts) or "—") + mark


def totals_sentence(total: NameTotals, days: int = TOTALS_DAYS) -> str:
    """``'resnet': 12 runs in the last 7 days left 3.1 GPU-hours idle ≈ $1.63``."""
    runs = f"{total.runs} run{'s' if total.runs != 1 else ''}"
    head = f"{total.name!r}: {runs} in the last {days} days"
    if total.idle_gpu_s <= 0:
        return f"{head}, no idle GPU time measured (CPU runs)"
    hours = total.idle_gpu_s / 3600
    amount = f"{hours:.1f} GPU-hours" if hours >= 1 else f"{total.idle_gpu_s / 60:.1f} GPU-min"
    text = f"{head} left {amount} idle"
    if total.priced_runs:
        text += f" \u2248 ${total.idle_cost_usd:.2f}"
    return text


def fixed_width(rows: list[dict[str, str]]) -> list[str]:
    """``rows`` (same keys) as a fixed-width text table, the keys as its head."""
    lines = [tuple(rows[0]), *(tuple(r.values()) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]


@dataclass
class StoredHistory:
    """``%traceml history --all`` / ``--name NAME``: stored runs of every session, latest
    ``STORED_ROWS``, and per name the idle GPU time of the last ``TOTALS_DAYS`` days."""

    cells: list[dict[str, str]]
    totals: list[str]
    shown: int
    stored: int
    path: str

    @classmethod
    def of(
        cls, store: Store, *, name: str | None = None, limit: int = STORED_ROWS
    ) -> StoredHistory:
        if not store.exists():
            return cls([], [], 0, 0, store.path)
        rows = store.rows(name=name, limit=limit)
        stored = store.count(name)
        since = time.time() - TOTALS_DAYS * 86400
        totals = [totals_sentence(t) for t in store.totals(since=since, name=name)]
        if name is not None and rows:
            return cls._with_shifts(store, name, rows, stored, totals)
        cells = [job_cells(group) for group in group_jobs(rows)]
        return cls(cells, totals, len(rows), stored, store.path)

    @classmethod
    def _with_shifts(
        cls, store: Store, name: str, rows: list[StoredRow], stored: int, totals: list[str]
    ) -> StoredHistory:
        """``--name NAME``: the runs on the latest run's hardware class, the shifts of their
        step time marked (``▲ +18%`` on a shift's first run) and told under the table."""
        from ..session.shifts import name_shifts
        from .shift_lines import shift_lines, shift_mark

        history = name_shifts(store, name)
        shown = [r for r in rows if r.hardware == history.hardware]
        per_sample = {  # the series' value of each run in it, where it is per sample
            r.id: ms
            for r, ms in zip(history.runs, history.judged_ms, strict=True)
            if history.per_sample
        }
        cells = []
        shown_values: dict[str, list[str]] = {}  # each name's hashed values, in order of first run
        for group in group_jobs(shown):
            row = job_cells(group)
            if per_sample:  # a column beside the step's
                judged = [per_sample[r.id] for r in group if r.id in per_sample]
                items = list(row.items())
                at = list(row).index("step") + 1
                value = fmt_ms(judged[0]) if judged else "\u2014"
                row = dict([*items[:at], ("per sample", value), *items[at:]])
            if history.split_by:  # which values each run was given, beside its step
                row = {**row, "given": given_cell(history, group[0].id, shown_values)}
            found = next((f for f in map(history.shift_from, (r.id for r in group)) if f), None)
            row["shift"] = shift_mark(found) if found is not None else ""
            cells.append(row)
        notes = shift_lines(history)
        other = len(rows) - len(shown)
        if other:
            notes.append(f"({other} runs on other hardware not shown)")
        return cls(cells, notes + totals, len(rows), stored, store.path)

    @property
    def text(self) -> str:
        if not self.cells:
            return f"No stored runs in {self.path}."
        lines = fixed_width(self.cells)
        if self.stored > self.shown:
            lines.append(f"({self.stored - self.shown:,} earlier stored runs not shown)")
        lines += self.totals
        lines.append(f"store: {self.path}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from html import escape

        from .html import history_html

        if not self.cells:
            return f"<div>{escape(self.text)}</div>"
        tail = list(self.totals) + [f"store: {self.path}"]
        if self.stored > self.shown:
            tail.insert(0, f"({self.stored - self.shown:,} earlier stored runs not shown)")
        notes = "".join(f"<div>{escape(line)}</div>" for line in tail)
        return history_html(self.cells, "") + notes

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)

    def __repr__(self) -> str:
        return self.text
