"""The kernel session's history of runs: what ``%traceml history`` lists and comparisons read.

Every finished run becomes a :class:`RunEntry` (numbered 1, 2, 3… in the session). Earlier runs
of *the same cell* are found by, in order: the same ``--name`` (when the user gave one), the
same frontend cell id, or, failing both, the most similar cell source (``difflib`` ratio ≥
``SIMILAR_SOURCE_RATIO``), so that editing a cell's DataLoader arguments and running it again
still pairs the two runs.

The history is bounded to ``MAX_RUNS`` runs (the oldest are dropped) and can be saved to and
loaded from a JSON file (:mod:`.history_file`).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..analysis.configuration import Configuration, configuration_of
from ..analysis.findings import Diagnosis, Summary
from ..analysis.pipeline import Analysis
from ..analysis.thresholds import MAX_STORED_STEPS
from ..engine.contracts import END_STATUSES, EndStatus
from .environment import hardware_class
from .history_file import FILE_FORMAT, FILE_VERSION, read_history_file, write_history_file

if TYPE_CHECKING:
    import numpy as np

    from ..engine.run import Run

#: Runs kept per session; adding one more drops the oldest.
MAX_RUNS = 500
#: Token similarity (:func:`source_similarity`) at or above which two cell sources are the same
#: cell. Adding four DataLoader arguments scores 0.71 on a two-line loop and 0.91 on a 7-line
#: training cell; that training cell scores 0.46 against an evaluation cell and 0.52 against
#: another training loop, and 0.1-0.3 against unrelated cells.
SIMILAR_SOURCE_RATIO = 0.6
#: Only this many of the latest earlier runs are compared by source (difflib is slow on long cells).
SIMILARITY_WINDOW = 50
DEFAULT_RUN_NAME = "run"


def downsample(values: Sequence[float] | np.ndarray, limit: int = MAX_STORED_STEPS) -> list[float]:
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
    cell_id: str | None  #: the frontend's cell id, when known
    source: str | None  #: the cell's text
    status: EndStatus
    error: str | None
    started_at: float  #: epoch seconds
    elapsed_s: float
    summary: Summary
    diagnosis: Diagnosis
    #: steady step times (the means of blocks of ``summary.step_block`` steps where that is
    #: more than 1), ≤ MAX_STORED_STEPS
    step_ms: list[float] = field(default_factory=list)
    loaders: list[dict[str, Any]] = field(default_factory=list)  #: LoaderInfo.to_dict() each
    named: bool = False  #: the user named the run (``--name``), so the name identifies the cell
    #: :func:`~.environment.capture_environment` of the run ({} when not captured)
    environment: dict[str, Any] = field(default_factory=dict)
    #: the machine's load during the run: ``other_cpu_share`` (0..1 of the machine's CPUs used
    #: by other processes, mean over the run; None when not sampled) and ``steal_share`` (0..1
    #: of its CPU time the hypervisor took, steal time, mean over the run; None where the
    #: kernel reports none)
    load: dict[str, Any] = field(default_factory=dict)
    #: the idle-GPU cost (:class:`~traceml_nb.analysis.findings.IdleCost` as a dict; None for a
    #: CPU run)
    cost: dict[str, Any] | None = None
    stored_id: int | None = None  #: the run's id in the store (``@id``), once stored
    origin: str = "session"  #: "session" (this kernel's history) or "store" (read back)
    session_id: str | None = None  #: the session that measured it (stored runs)
    #: its rank, the world size and the job id in a ``torchrun`` job (None: a run alone)
    rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "named": self.named,
            "cell_id": self.cell_id,
            "source": self.source,
            "status": self.status,
            "error": self.error,
            "started_at": self.started_at,
            "elapsed_s": self.elapsed_s,
            "summary": self.summary.to_dict(),
            "diagnosis": self.diagnosis.to_dict(),
            "step_ms": list(self.step_ms),
            "loaders": [dict(d) for d in self.loaders],
            "environment": dict(self.environment),
            "load": dict(self.load),
            "cost": dict(self.cost) if self.cost is not None else None,
            "stored_id": self.stored_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "job_id": self.job_id,
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
            cell_id=data.get("cell_id", data.get("cell_key")),  # "cell_key" before 0.2
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
            environment=dict(data.get("environment") or {}),
            load=dict(data.get("load") or {}),
            cost=dict(data["cost"]) if isinstance(data.get("cost"), dict) else None,
            stored_id=data.get("stored_id") if isinstance(data.get("stored_id"), int) else None,
            rank=data.get("rank") if isinstance(data.get("rank"), int) else None,
            world_size=data.get("world_size") if isinstance(data.get("world_size"), int) else None,
            job_id=str(data["job_id"]) if data.get("job_id") else None,
        )

    @property
    def label(self) -> str:
        """``#3 baseline`` (a run of this session) or ``@17 baseline`` (a stored run)."""
        if self.origin == "store":
            return f"@{self.stored_id} {self.name}"
        return f"#{self.id} {self.name}"

    @property
    def configuration(self) -> Configuration:
        """The run's :class:`~traceml_nb.analysis.configuration.Configuration`: its name (a
        ``cell [n]`` fallback counts as no name: its code is what identifies the cell), code,
        training DataLoader, versions and hardware class. Computed on each read, not kept: the
        environment is filled in after the entry is made."""
        return run_configuration(self.name, self.named, self.source, self.loaders, self.environment)


#: ``cell [12]``: the name of a run given none; it names no cell across sessions.
_FALLBACK_NAME = re.compile(r"^cell \[\d+\]$")


def name_is_stable(name: str, named: bool) -> bool:
    """A run's ``name`` identifies its cell across sessions: given with ``--name``
    (``named``), or read from the cell's leading comment (not the ``cell [n]`` fallback, nor
    the default ``run``)."""
    return named or not (_FALLBACK_NAME.match(name) or name == DEFAULT_RUN_NAME)


def stable_name(entry: RunEntry) -> bool:
    """:func:`name_is_stable` of ``entry``."""
    return name_is_stable(entry.name, entry.named)


def run_configuration(
    name: str,
    named: bool,
    source: str | None,
    loaders: list[dict[str, Any]],
    environment: dict[str, Any],
    hardware: str | None = None,
) -> Configuration:
    """:attr:`RunEntry.configuration` from the entry's parts, as the store keeps them (its
    schema 4 migration keys the runs stored before); ``hardware`` defaults to
    ``hardware_class(environment)``."""
    return configuration_of(
        name if name_is_stable(name, named) else "",
        source,
        loaders,
        environment,
        hardware_class(environment) if hardware is None else hardware,
    )


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
        ("status", lambda v: v in END_STATUSES, f"one of {', '.join(END_STATUSES)}"),
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
    for key in ("cell_id", "cell_key", "source", "error"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"'{key}' must be a string or null")
    for key in ("verdict", "confidence"):
        if not isinstance(data["diagnosis"].get(key), str):
            raise ValueError(f"'diagnosis.{key}' must be a string")
    title = data["diagnosis"].get("title")
    if not isinstance(title, str) and not (
        isinstance(title, dict) and isinstance(title.get("code"), str)
    ):
        raise ValueError(
            "'diagnosis.title' must be a finding (an object with a 'code') or a string"
        )
    if not isinstance(data["summary"].get("step_source"), str):
        raise ValueError("'summary.step_source' must be a string")


def entry_from(run_like: Run, analysis: Analysis) -> RunEntry:
    """A history entry (id 0 until added) for an ended :class:`traceml_nb.engine.run.Run`: its name,
    ``named``, ``cell_id``, ``source``, status and times, and ``analysis``' figures."""
    name = str(getattr(run_like, "name", None) or DEFAULT_RUN_NAME)
    named = bool(getattr(run_like, "named", name != DEFAULT_RUN_NAME))
    status = getattr(run_like, "status", "completed")
    if status not in END_STATUSES:
        raise ValueError(f"run {name!r} is {status}: only an ended run can join the history")
    return RunEntry(
        id=0,
        name=name,
        cell_id=getattr(run_like, "cell_id", None),
        source=getattr(run_like, "source", None),
        status=status,
        error=getattr(run_like, "error", None),
        started_at=float(getattr(run_like, "started_at", None) or time.time()),
        elapsed_s=float(getattr(run_like, "elapsed_s", 0.0)),
        summary=analysis.summary,
        diagnosis=analysis.diagnosis,
        step_ms=[] if analysis.steady_step_ms is None else downsample(analysis.steady_step_ms),
        loaders=[info.to_dict() for info in run_like.record.loaders],
        named=named,
        rank=getattr(run_like, "rank", None),
        world_size=getattr(run_like, "world_size", None),
        job_id=getattr(run_like, "job_id", None),
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
    def get(self, ref: int | str, *, other_than: RunEntry | None = None) -> RunEntry:
        """A run by id (``3``, ``"3"``, ``"#3"``) or by name (the latest run with that name,
        other than ``other_than``); ``KeyError`` saying what the history has otherwise."""
        if self.is_number(ref):
            found = self._by_id(int(str(ref).strip().lstrip("#")))
            if found is not None and found is other_than:
                found = None
        else:
            text = str(ref).strip()
            named = [e for e in self.entries if e.name == text and e is not other_than]
            found = named[-1] if named else None
            if found is None and other_than is not None and other_than.name == text:
                raise KeyError(
                    f"{text!r} is run {other_than.label} itself, and no other run has that name"
                )
        if found is None:
            raise KeyError(self._unknown(ref))
        return found

    def is_number(self, ref: int | str) -> bool:
        """``ref`` names a run by its number (``3``, ``"3"``, ``"#3"``) rather than its name;
        a name of digits only is taken as a number only when no run has that number."""
        if isinstance(ref, bool):
            return False
        if isinstance(ref, int):
            return True
        text = str(ref).strip()
        digits = text[1:] if text.startswith("#") else text
        if not digits.isdigit():
            return False
        return text.startswith("#") or self._by_id(int(digits)) is not None

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
        if entry.cell_id is not None:
            same_key = [e for e in earlier if e.cell_id == entry.cell_id]
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
        """The earlier run of the same cell with the lowest median step time; per sample where
        every such run's batch size is known (a smaller batch makes a shorter step, not a
        better run)."""
        runs = [
            e
            for e in self.same_cell(entry)
            if _comparable(e) and e.summary.step_ms_median is not None
        ]
        if not runs:
            return None
        per_sample = all(e.summary.batch_size for e in runs)

        def judged(e: RunEntry) -> tuple[float, int]:
            step = float(e.summary.step_ms_median or 0.0)
            return (step / (e.summary.batch_size or 1) if per_sample else step), -e.id

        return min(runs, key=judged)

    # --- persistence --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The history as the JSON document :mod:`.history_file` writes."""
        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "next_id": self._next_id,
            "runs": [e.to_dict() for e in self.entries],
        }

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the history to ``path`` as JSON, atomically (a crash leaves the old file);
        returns the absolute path written."""
        return write_history_file(path, self.to_dict())

    def load(self, path: str | os.PathLike[str]) -> int:
        """Replace the history with the runs saved in ``path``; returns how many were loaded.

        The whole file is read and checked first; on any problem :class:`HistoryFileError` is
        raised and the history is left as it was.
        """
        entries, next_id = read_history_file(path, RunEntry.from_dict)
        self._replace(entries[-self.max_runs :], next_id)
        return len(self.entries)
