"""The kernel session's history of runs: what ``%traceml history`` lists and comparisons read.

Every finished run becomes a :class:`RunEntry` (numbered 1, 2, 3… in the session). Earlier runs
of *the same cell* are found by, in order: the same ``--name`` (when the user gave one), the
same frontend cell id, or, failing both, the most similar cell source (``difflib`` ratio ≥
``SIMILAR_SOURCE_RATIO``), so that editing a cell's DataLoader arguments and running it again
still pairs the two runs.

The history is bounded to ``MAX_RUNS`` runs (the oldest are dropped) and can be saved to and
loaded from a JSON file; loading validates the whole file before the history is touched, and
never unpickles or evaluates anything.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .analysis.formatting import fmt_ms, fmt_pct, fmt_rate, fmt_s, fmt_share, signed_pct
from .analysis.model import Analysis, Diagnosis, Summary
from .analysis.pipeline import steady_step_ms
from .analysis.thresholds import MAX_STORED_STEPS

#: Runs kept per session; adding one more drops the oldest.
MAX_RUNS = 500
#: Token similarity (:func:`source_similarity`) at or above which two cell sources are the same
#: cell. Adding four DataLoader arguments scores 0.71 on a two-line loop and 0.91 on a 7-line
#: training cell; that training cell scores 0.46 against an evaluation cell and 0.52 against
#: another training loop, and 0.1-0.3 against unrelated cells.
SIMILAR_SOURCE_RATIO = 0.6
#: Only this many of the latest earlier runs are compared by source (difflib costs ~1 ms each).
SIMILARITY_WINDOW = 50
FILE_FORMAT = "traceml_nb.history"
FILE_VERSION = 1
STATUSES = ("completed", "failed", "interrupted")
DEFAULT_RUN_NAME = "run"


class HistoryFileError(ValueError):
    """A history file that cannot be loaded (corrupt, not ours, or another version)."""


def downsample(values: Any, limit: int = MAX_STORED_STEPS) -> list[float]:
    """At most ``limit`` values, picked evenly across ``values`` (first and last kept)."""
    n = len(values)
    if n <= limit:
        return [float(v) for v in values]
    step = (n - 1) / (limit - 1)
    return [float(values[round(i * step)]) for i in range(limit)]


@dataclass
class RunEntry:
    """One run as the history keeps it (JSON-able through :meth:`to_dict`)."""

    id: int  #: assigned by the history: 1, 2, 3…
    name: str
    cell_key: str | None  #: the frontend's cell id, when known
    source: str | None  #: the cell's text
    status: str  #: "completed", "failed" or "interrupted"
    error: str | None
    started_at: float  #: epoch seconds
    elapsed_s: float
    summary: Summary
    diagnosis: Diagnosis
    step_ms: list[float] = field(default_factory=list)  #: steady step times, ≤ MAX_STORED_STEPS
    loaders: list[dict[str, Any]] = field(default_factory=list)  #: LoaderInfo.to_dict() each
    named: bool = False  #: the user named the run (``--name``), so the name identifies the cell

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "named": self.named,
            "cell_key": self.cell_key,
            "source": self.source,
            "status": self.status,
            "error": self.error,
            "started_at": self.started_at,
            "elapsed_s": self.elapsed_s,
            "summary": self.summary.to_dict(),
            "diagnosis": self.diagnosis.to_dict(),
            "step_ms": list(self.step_ms),
            "loaders": [dict(d) for d in self.loaders],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunEntry:
        """Build an entry from :meth:`to_dict` output; raises ``ValueError`` naming what is wrong."""
        _check_entry(data)
        try:
            summary = Summary.from_dict(data["summary"])
            diagnosis = Diagnosis.from_dict(data["diagnosis"])
        except TypeError as exc:
            raise ValueError(f"summary or diagnosis is incomplete: {exc}") from None
        return cls(
            id=data["id"],
            name=data["name"],
            cell_key=data.get("cell_key"),
            source=data.get("source"),
            status=data["status"],
            error=data.get("error"),
            started_at=float(data["started_at"]),
            elapsed_s=float(data["elapsed_s"]),
            summary=summary,
            diagnosis=diagnosis,
            step_ms=[float(v) for v in data["step_ms"]],
            loaders=[dict(d) for d in data["loaders"]],
            named=bool(data.get("named", False)),
        )

    @property
    def label(self) -> str:
        """``#3 baseline``."""
        return f"#{self.id} {self.name}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_entry(data: Any) -> None:
    if not isinstance(data, dict):
        raise ValueError("a run must be a JSON object")
    checks = [
        (
            "id",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
            "a positive integer",
        ),
        ("name", lambda v: isinstance(v, str), "a string"),
        ("status", lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}"),
        ("started_at", _is_number, "a number"),
        ("elapsed_s", _is_number, "a number"),
        ("summary", lambda v: isinstance(v, dict), "an object"),
        ("diagnosis", lambda v: isinstance(v, dict), "an object"),
        (
            "step_ms",
            lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
            "a list of numbers",
        ),
        (
            "loaders",
            lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
            "a list of objects",
        ),
    ]
    for key, ok, what in checks:
        if key not in data:
            raise ValueError(f"'{key}' is missing")
        if not ok(data[key]):
            raise ValueError(f"'{key}' must be {what}")
    for key in ("cell_key", "source", "error"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"'{key}' must be a string or null")
    for key in ("verdict", "title", "confidence"):
        if not isinstance(data["diagnosis"].get(key), str):
            raise ValueError(f"'diagnosis.{key}' must be a string")
    if not isinstance(data["summary"].get("step_source"), str):
        raise ValueError("'summary.step_source' must be a string")


def entry_from(
    run_like: Any,
    analysis: Analysis,
    *,
    cell_key: str | None = None,
    source: str | None = None,
    named: bool | None = None,
) -> RunEntry:
    """A history entry (id 0 until added) for a finished :class:`traceml_nb.run.Run`.

    ``cell_key``/``source`` default to the run's ``cell_id``/``source``; ``named`` defaults to
    "the run's name is not the default ``run``".
    """
    name = str(getattr(run_like, "name", None) or DEFAULT_RUN_NAME)
    if named is None:
        named = name != DEFAULT_RUN_NAME
    record = run_like.record
    steps = steady_step_ms(record, analysis.summary.warmup_steps)
    status = getattr(run_like, "status", "completed")
    if status not in STATUSES:
        raise ValueError(f"run {name!r} is {status}: only an ended run can join the history")
    return RunEntry(
        id=0,
        name=name,
        cell_key=cell_key if cell_key is not None else getattr(run_like, "cell_id", None),
        source=source if source is not None else getattr(run_like, "source", None),
        status=status,
        error=getattr(run_like, "error", None),
        started_at=float(getattr(run_like, "started_at", None) or time.time()),
        elapsed_s=float(getattr(run_like, "elapsed_s", 0.0)),
        summary=analysis.summary,
        diagnosis=analysis.diagnosis,
        step_ms=downsample(steps),
        loaders=[info.to_dict() for info in record.loaders],
        named=bool(named),
    )


def _comparable(entry: RunEntry) -> bool:
    return len(entry.step_ms) >= 2


_TOKEN = re.compile(r"\w+|[^\w\s]")


def source_similarity(a: str, b: str) -> float:
    """``difflib`` similarity of two cell sources, 0..1, on their tokens (names, numbers and
    single punctuation marks), so that re-wrapping lines or re-indenting changes nothing."""
    matcher = difflib.SequenceMatcher(None, _TOKEN.findall(a), _TOKEN.findall(b))
    if (
        matcher.real_quick_ratio() < SIMILAR_SOURCE_RATIO
        or matcher.quick_ratio() < SIMILAR_SOURCE_RATIO
    ):
        return matcher.quick_ratio()  # an upper bound, already below the threshold
    return matcher.ratio()


class History:
    """The runs of this kernel session, oldest first, at most ``max_runs``."""

    def __init__(self, max_runs: int = MAX_RUNS) -> None:
        self.max_runs = max_runs
        self.entries: list[RunEntry] = []
        self._next_id = 1
        self.dropped = 0  #: runs dropped because the history was full
        self._index: dict[int, RunEntry] = {}
        self._predecessors: dict[int, int | None] = {}  #: run id -> id of the run it pairs with

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: RunEntry) -> RunEntry:
        """Number ``entry`` and keep it (dropping the oldest run past ``max_runs``)."""
        entry.id = self._next_id
        self._next_id += 1
        self.entries.append(entry)
        self._index[entry.id] = entry
        overflow = len(self.entries) - self.max_runs
        if overflow > 0:
            for old in self.entries[:overflow]:
                self._index.pop(old.id, None)
                self._predecessors.pop(old.id, None)
            del self.entries[:overflow]
            self.dropped += overflow
        return entry

    def clear(self) -> None:
        """Forget every run; numbering starts again at 1."""
        self._replace([], 1)

    def _replace(self, entries: list[RunEntry], next_id: int) -> None:
        self.entries = entries
        self._next_id = next_id
        self.dropped = 0
        self._index = {e.id: e for e in entries}
        self._predecessors = {}

    # --- lookup -----------------------------------------------------------------------------
    def get(self, ref: int | str) -> RunEntry:
        """A run by id (``3``, ``"3"``, ``"#3"``) or by name (the latest run with that name)."""
        if isinstance(ref, int) and not isinstance(ref, bool):
            found = self._by_id(ref)
        else:
            text = str(ref).strip()
            digits = text[1:] if text.startswith("#") else text
            found = self._by_id(int(digits)) if digits.isdigit() else None
            if found is None and not (text.startswith("#") and digits.isdigit()):
                named = [e for e in self.entries if e.name == text]
                found = named[-1] if named else None
        if found is None:
            raise KeyError(self._unknown(ref))
        return found

    def _by_id(self, run_id: int) -> RunEntry | None:
        return self._index.get(run_id)

    def _unknown(self, ref: int | str) -> str:
        if not self.entries:
            return f"no run {ref!r}: the history of this session is empty"
        listed = ", ".join(e.label for e in self.entries[-20:])
        more = f" (and {len(self.entries) - 20} earlier)" if len(self.entries) > 20 else ""
        return f"no run {ref!r} in this session's history; it has {listed}{more}"

    def predecessor(self, entry: RunEntry) -> RunEntry | None:
        """The run ``entry`` pairs with: the latest earlier run with the same ``--name``, else
        with the same cell id, else the earlier run (of the last ``SIMILARITY_WINDOW``) whose
        source is most similar (ratio ≥ ``SIMILAR_SOURCE_RATIO``; ties: the latest)."""
        kept = self._index.get(entry.id) is entry
        if kept and entry.id in self._predecessors:
            cached = self._predecessors[entry.id]
            return self._index.get(cached) if cached is not None else None
        found = self._find_predecessor(entry)
        if kept:
            self._predecessors[entry.id] = found.id if found is not None else None
        return found

    def _find_predecessor(self, entry: RunEntry) -> RunEntry | None:
        earlier = [e for e in self.entries if e is not entry and (entry.id == 0 or e.id < entry.id)]
        if entry.named:
            same_name = [e for e in earlier if e.named and e.name == entry.name]
            if same_name:
                return same_name[-1]
        if entry.cell_key is not None:
            same_key = [e for e in earlier if e.cell_key == entry.cell_key]
            if same_key:
                return same_key[-1]
        if not entry.source:
            return None
        best: tuple[float, RunEntry] | None = None
        for e in [e for e in earlier if e.source][-SIMILARITY_WINDOW:]:
            assert e.source is not None
            ratio = source_similarity(entry.source, e.source)
            if ratio >= SIMILAR_SOURCE_RATIO and (best is None or ratio >= best[0]):
                best = (ratio, e)
        return best[1] if best is not None else None

    def same_cell(self, entry: RunEntry) -> list[RunEntry]:
        """The earlier runs of ``entry``'s cell, oldest first: the chain of predecessors
        (so an edit of an edit still reaches the first version)."""
        chain: list[RunEntry] = []
        seen = {entry.id}
        current = self.predecessor(entry)
        while current is not None and current.id not in seen:
            chain.append(current)
            seen.add(current.id)
            current = self.predecessor(current)
        return chain[::-1]

    def previous_of(self, entry: RunEntry) -> RunEntry | None:
        """The latest earlier run of the same cell that has steady steps to compare."""
        runs = [e for e in self.same_cell(entry) if _comparable(e)]
        return runs[-1] if runs else None

    def best_of(self, entry: RunEntry) -> RunEntry | None:
        """The earlier run of the same cell with the lowest median step time."""
        runs = [
            e
            for e in self.same_cell(entry)
            if _comparable(e) and e.summary.step_ms_median is not None
        ]
        if not runs:
            return None
        return min(runs, key=lambda e: (e.summary.step_ms_median, -e.id))

    # --- persistence --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "next_id": self._next_id,
            "runs": [e.to_dict() for e in self.entries],
        }

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the history to ``path`` as JSON, atomically (a crash leaves the old file)."""
        target = os.path.abspath(os.fspath(path))
        data = _finite(self.to_dict())
        fd, tmp = tempfile.mkstemp(
            prefix=".traceml-history-", suffix=".tmp", dir=os.path.dirname(target)
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, allow_nan=False, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return target

    def load(self, path: str | os.PathLike[str]) -> int:
        """Replace the history with the runs saved in ``path``; returns how many were loaded.

        The whole file is read and checked first; on any problem :class:`HistoryFileError` is
        raised and the history is left as it was.
        """
        entries, next_id = read_history_file(path)
        self._replace(entries[-self.max_runs :], next_id)
        return len(self.entries)


def _finite(value: Any) -> Any:
    """``value`` with every NaN/infinity replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_history_file(path: str | os.PathLike[str]) -> tuple[list[RunEntry], int]:
    """The runs in a history file and the next id, or :class:`HistoryFileError`."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise HistoryFileError(f"cannot read history file {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HistoryFileError(
            f"{where} is not a traceml_nb history file (not UTF-8 text)"
        ) from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise HistoryFileError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise HistoryFileError(
            f'{where} is not a traceml_nb history file (no "format": "{FILE_FORMAT}")'
        )
    version = data.get("version")
    if version != FILE_VERSION:
        raise HistoryFileError(
            f"{where} is a traceml_nb history of version {version!r}; this traceml_nb reads version {FILE_VERSION}"
        )
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise HistoryFileError(f"{where}: 'runs' must be a list")
    entries = []
    for position, item in enumerate(runs, 1):
        try:
            entries.append(RunEntry.from_dict(item))
        except ValueError as exc:
            raise HistoryFileError(f"{where}: run {position} of {len(runs)}: {exc}") from None
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        raise HistoryFileError(f"{where}: run ids must be unique and increasing")
    next_id = data.get("next_id")
    if not (isinstance(next_id, int) and not isinstance(next_id, bool)) or next_id <= max(
        ids, default=0
    ):
        raise HistoryFileError(f"{where}: 'next_id' must be an integer above every run id")
    return entries, next_id


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a history file")


# --- the plain table behind `%traceml history` -----------------------------------------------
def history_table(history: History) -> list[dict[str, Any]]:
    """One plain dict per run, oldest first, for the text and HTML renderers.

    Keys: ``id``, ``label``, ``name``, ``status``, ``started_at`` (epoch s), ``started``
    (HH:MM:SS local), ``elapsed_s``, ``steady_steps``, ``step_ms_median``, ``samples_per_s``,
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
        "steps": f"{row['steady_steps']:,}",
        "step": maybe(row.get("step_ms_median"), fmt_ms),
        "throughput": maybe(row.get("samples_per_s"), lambda v: fmt_rate(v, "samples/s")),
        "data wait": maybe(row.get("data_wait_share"), fmt_share),
        "GPU util": maybe(row.get("gpu_util_median_pct"), fmt_pct),
        "verdict": str(row["verdict"]),
        "vs": vs,
    }


def render_history_text(history: History) -> str:
    """``%traceml history`` as plain text: a fixed-width table, oldest run first."""
    rows = [history_cells(r) for r in history_table(history)]
    if not rows:
        return "No traceml_nb runs in this session yet."
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


_session: History | None = None


def session_history() -> History:
    """The history of this kernel session (one per process)."""
    global _session
    if _session is None:
        _session = History()
    return _session
