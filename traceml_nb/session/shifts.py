"""A name's stored history and the shifts of its step time, with what came with each.

:func:`name_shifts` reads the completed runs of a name with a median step time, on one
hardware class (the latest run's by default), oldest first — where values the runs were given
tell them apart (:mod:`~traceml_nb.analysis.variants`: ``--model small`` and ``big`` in turn),
those given the latest run's, as a comparison's baseline takes them — runs the change points
(:mod:`~traceml_nb.analysis.changepoints`) over their medians (per sample where their batch
sizes differ, as a comparison's are: a doubled batch is no slowdown), and for each shift
compares the last run before it with the first run after it
(:func:`~traceml_nb.analysis.attribution.what_changed`: code, DataLoader settings,
environment, machine load). Runs of a ``torchrun``
job are left out while the name has runs alone; a name whose runs are all ranks of jobs is
read one job a point, by its slowest rank (:mod:`.stored_jobs`).

:func:`check_history` is ``python -m traceml_nb check --history``: is the latest shift a
slowdown beyond the allowed share, still holding? It reads the store, never writes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..analysis.attribution import what_changed
from ..analysis.changepoints import ChangePoint, Shifts, change_points
from ..analysis.comparison import batch_sizes_differ
from ..analysis.findings import Changes
from ..analysis.thresholds import CHANGE_MIN_RUNS, DEFAULT_MAX_SLOWDOWN
from ..analysis.variants import told_apart, unsettled_names
from .store import Store, StoreError, resolve_store_path
from .store_rows import StoredRow
from .stored_jobs import jobs_values, split_jobs

EXIT_OK, EXIT_SLOWDOWN, EXIT_NO_VERDICT = 0, 1, 2
PASS, SLOWDOWN, TOO_SHORT, ERROR = "pass", "regression", "too short", "error"
#: ``NameShifts.left_out``'s reason for the runs given other values than the latest run's
OTHER_VALUES_LEFT_OUT = "given other values"


@dataclass
class Shift:
    """One shift of a name's step time: ``point`` (its index in ``NameShifts.runs``), the last
    run before it (``before``) and the first run after it (``after``), and what changed
    between those two (``changes``)."""

    point: ChangePoint
    before: StoredRow
    after: StoredRow
    changes: Changes
    #: runs of the series from ``after`` to the latest, ``after`` included
    runs_since: int


@dataclass
class NameShifts:
    """The step-time history of ``name`` on ``hardware``: ``runs`` (the series, oldest
    first), their change points (``shifts``) and each shift with what came with it
    (``found``). ``left_out``: runs of the name not in the series, by reason (``"failed"``,
    ``"no step time"``, ``"other hardware"``, ``"torchrun job"``), each a count.

    ``per_sample``: the series is the time per sample (median step / batch size), since the
    runs' batch sizes (``batch_sizes``, one a run; None: not counted) are all known and differ
    by ``BATCH_SIZE_CHANGE_SHARE`` or more; the shifts' times are then per sample too.
    ``judged_ms``: each run's value in the series (ms: its median step, or per sample).
    ``split_by``: the values (names) that told the name's runs apart: the series holds those
    given the latest run's, the others are left out (``"given other values"``); ``given``:
    then every run's values on the hardware, by run id (:func:`~traceml_nb.analysis.variants.
    values_of`)."""

    name: str
    hardware: str | None
    runs: list[StoredRow]
    shifts: Shifts
    found: list[Shift] = field(default_factory=list)
    left_out: dict[str, int] = field(default_factory=dict)
    batch_sizes: list[int | None] = field(default_factory=list)
    per_sample: bool = False
    judged_ms: list[float] = field(default_factory=list)
    split_by: tuple[str, ...] = ()
    given: dict[int, dict[str, str]] = field(default_factory=dict)

    @property
    def latest(self) -> Shift | None:
        """The most recent shift, or None."""
        return self.found[-1] if self.found else None

    def shift_from(self, run_id: int) -> Shift | None:
        """The shift whose first run is the stored run ``run_id``, or None."""
        return next((s for s in self.found if s.after.id == run_id), None)


def _series(rows: list[StoredRow], hardware: str | None) -> tuple[list[StoredRow], dict[str, int]]:
    left_out: dict[str, int] = {}

    def drop(reason: str, count: int = 1) -> None:
        if count:
            left_out[reason] = left_out.get(reason, 0) + count

    alone = [r for r in rows if r.job_id is None]
    if alone:
        drop("torchrun job", len(rows) - len(alone))
        candidates = alone
    else:  # every run is a rank of a job: one point a whole job, its slowest rank
        candidates = []
        for job in split_jobs(rows):
            slowest = job.slowest if job.complete else None
            if slowest is None:
                drop("failed")
            else:
                candidates.append(slowest)
    series = []
    for row in candidates:
        if hardware is not None and row.hardware != hardware:
            drop("other hardware")
        elif row.status != "completed":
            drop("failed")
        elif row.step_ms_median is None or not row.step_ms_median > 0:
            drop("no step time")
        else:
            series.append(row)
    return series, left_out


def name_shifts(store: Store, name: str, *, hardware: str | None = None) -> NameShifts:
    """The shifts of ``name``'s stored step time on ``hardware`` (None: the hardware class of
    its latest stored run). :class:`~.store.StoreError` when the store cannot be read."""
    rows = store.rows(name=name)
    if hardware is None and rows:
        hardware = rows[-1].hardware
    series, left_out = _series(rows, hardware)
    values = store.values_given(name) if series else {}
    own: set[str] = set()  # what differs between a job's ranks (a --local-rank): the rank's
    if series and series[0].job_id is not None:  # a job a point: what all its ranks were given
        values, own = jobs_values(split_jobs(rows), values)
    alike, split_by = _given_the_latest_values(series, values)
    if split_by:
        left_out[OTHER_VALUES_LEFT_OUT] = len(series) - len(alike)
    series = alike
    sizes = store.batch_sizes(name) if series else {}
    batch_sizes = [sizes.get(r.id) for r in series]
    per_sample = batch_sizes_differ(batch_sizes)
    medians = [float(r.step_ms_median or 0) for r in series]
    if per_sample:
        medians = [ms / (size or 1) for ms, size in zip(medians, batch_sizes, strict=True)]
    shifts = change_points(medians)
    found = []
    if shifts.points:
        unsettled = unsettled_names(values.get(r.id, {}) for r in series)
        ids = {r.id for p in shifts.points for r in (series[p.index - 1], series[p.index])}
        entries = {e.stored_id: e for e in store.entries(sorted(ids))}
        for p in shifts.points:
            before, after = series[p.index - 1], series[p.index]
            changes = what_changed(
                entries.get(before.id), entries.get(after.id), unsettled=unsettled, ranks_own=own
            )
            found.append(Shift(p, before, after, changes, len(series) - p.index))
    return NameShifts(
        name, hardware, series, shifts, found, left_out, batch_sizes, per_sample, medians, split_by,
        values if split_by else {},
    )  # fmt: skip


def _given_the_latest_values(
    series: list[StoredRow], values: dict[int, dict[str, str]]
) -> tuple[list[StoredRow], tuple[str, ...]]:
    """Of ``series``, the runs given the latest run's values where values tell them apart
    (a name counts once a value of it repeats), and the names that told them apart."""
    if not series:
        return series, ()
    given = [values.get(r.id, {}) for r in series]
    picked, same, split_by = told_apart(given[-1], given[:-1])
    if same is None:
        return series, ()
    return [*(series[i] for i in picked if same), series[-1]], split_by


@dataclass
class HistoryCheck:
    """``check --history``'s outcome: ``status`` ("pass", "regression", "too short",
    "error") and ``exit_code`` (0, 1, 2); ``history`` the name's shifts (None when the store
    could not be read: ``error`` says why); ``max_slowdown`` the allowed slowdown, a
    fraction."""

    exit_code: int
    status: str
    name: str
    max_slowdown: float
    store_path: str | None
    history: NameShifts | None = None
    error: str | None = None

    @property
    def shift(self) -> Shift | None:
        """The latest shift, which the verdict is about (None: no shift)."""
        return self.history.latest if self.history is not None else None

    def to_dict(self) -> dict[str, Any]:
        shift = self.shift
        history = self.history
        return {
            "exit_code": self.exit_code,
            "status": self.status,
            "name": self.name,
            "max_slowdown": self.max_slowdown,
            "store_path": self.store_path,
            "error": self.error,
            "hardware": history.hardware if history is not None else None,
            "runs": [r.id for r in history.runs] if history is not None else [],
            "needed": history.shifts.needed if history is not None else None,
            # the shifts' times are per sample (the runs' batch sizes differ), else per step
            "per_sample": history.per_sample if history is not None else None,
            "shifts": [
                {
                    "from": s.after.id,
                    "before": s.before.id,
                    "before_ms": s.point.before_ms,
                    "after_ms": s.point.after_ms,
                    "change": s.point.change,
                    "p_value": s.point.p_value,
                    "changes": s.changes.lines(),
                }
                for s in (history.found if history is not None else [])
            ],
            "latest": shift.after.id if shift is not None else None,
        }


def check_history(
    name: str,
    *,
    store: str | os.PathLike[str] | None = None,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
) -> HistoryCheck:
    """Is the latest shift of ``name``'s step time a slowdown of more than ``max_slowdown``?
    Being the latest, it still holds: every run since is in its slow segment (at least
    ``CHANGE_MIN_RUNS`` of them). Exit code 1 then; 0 for no shift, or a latest shift that is
    a speed-up or a smaller slowdown; 2 for a history too short to tell or a store that cannot
    be read (never raised)."""
    path = resolve_store_path(store)
    if path is None:
        return HistoryCheck(
            EXIT_NO_VERDICT, ERROR, name, max_slowdown, None, error="storing is off"
        )
    target = Store(path)
    path = target.path  # what may be shown (a server's password hidden)
    if not target.exists():
        return HistoryCheck(
            EXIT_NO_VERDICT, ERROR, name, max_slowdown, path, error=f"no store at {path}"
        )
    try:
        history = name_shifts(target, name)
    except StoreError as exc:
        return HistoryCheck(EXIT_NO_VERDICT, ERROR, name, max_slowdown, path, error=str(exc))
    if not history.shifts.judged:
        return HistoryCheck(EXIT_NO_VERDICT, TOO_SHORT, name, max_slowdown, path, history)
    latest = history.latest
    if latest is not None and latest.point.change > max_slowdown:
        assert latest.runs_since >= CHANGE_MIN_RUNS
        return HistoryCheck(EXIT_SLOWDOWN, SLOWDOWN, name, max_slowdown, path, history)
    return HistoryCheck(EXIT_OK, PASS, name, max_slowdown, path, history)
