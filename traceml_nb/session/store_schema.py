"""The run store's schema: the version this traceml_nb reads and writes, the columns of a run,
and the migrations that bring an older store up to date (:class:`~.store.Store` applies them in
one transaction when it opens a store). Written in SQLite's dialect, one text for both backends
(a server's translates it: :func:`~.store_postgres.dialect`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .history import run_configuration
from .store_backend import Connection

#: The schema this traceml_nb reads and writes.
SCHEMA_VERSION = 4

RUN_COLUMNS = (
    "name",
    "named",
    "cell_id",
    "status",
    "error",
    "started_at",
    "elapsed_s",
    "hardware",
    "session",
    "session_run",
    "total_steps",
    "steady_steps",
    "step_ms_median",
    "samples_per_s",
    "data_wait_share",
    "gpu_util_median_pct",
    "verdict",
    "cause",
    "idle_gpu_s",
    "idle_cost_usd",
    "source",
    "summary",
    "diagnosis",
    "loaders",
    "environment",
    "load",
    "step_ms",
    "steal_share",
    "rank",
    "world_size",
    "job_id",
    "config",
    "other_cpu_share",
)


def _backfill_configurations(conn: Connection) -> None:
    """Schema 4: the configuration key and the other processes' CPU share of every run stored
    before, computed from what it stored (name, source, loaders, environment, hardware class):
    the same key a new run of that configuration gets."""
    rows = conn.execute(
        "SELECT id, name, named, source, loaders, environment, hardware, load FROM runs"
    ).fetchall()
    updates = []
    for run_id, name, named, source, loaders, environment, hardware, load in rows:
        try:
            config: str | None = run_configuration(
                name, bool(named), source, json.loads(loaders), json.loads(environment), hardware
            ).key
        except (ValueError, TypeError, AttributeError):  # JSON that is not what was written
            config = None  # its configuration is unknown: it joins no other run's
        try:
            share = share_or_null((json.loads(load).get("load") or {}).get("other_cpu_share"))
        except (ValueError, TypeError, AttributeError):
            share = None
        updates.append((config, share, run_id))
    conn.executemany("UPDATE runs SET config = ?, other_cpu_share = ? WHERE id = ?", updates)


def share_or_null(value: Any) -> float | None:
    """A stored share as a column: a finite number, else NULL."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


#: (version, what it does, steps): applied in order to a store of an older version; a step is an
#: SQL statement or a function of the connection, run inside the same transaction.
MIGRATIONS: list[tuple[int, str, tuple[str | Callable[[Connection], None], ...]]] = [
    (
        1,
        "runs and pinned baselines",
        (
            """CREATE TABLE runs (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                name TEXT NOT NULL, named INTEGER NOT NULL, cell_id TEXT,
                status TEXT NOT NULL, error TEXT,
                started_at REAL NOT NULL, elapsed_s REAL NOT NULL,
                hardware TEXT NOT NULL, session TEXT, session_run INTEGER,
                total_steps INTEGER, steady_steps INTEGER, step_ms_median REAL,
                samples_per_s REAL, data_wait_share REAL, gpu_util_median_pct REAL,
                verdict TEXT, cause TEXT, idle_gpu_s REAL, idle_cost_usd REAL,
                source TEXT, summary TEXT NOT NULL, diagnosis TEXT NOT NULL,
                loaders TEXT NOT NULL, environment TEXT NOT NULL, load TEXT NOT NULL,
                step_ms BLOB NOT NULL)""",
            "CREATE INDEX runs_by_name ON runs (name, hardware, id)",
            "CREATE INDEX runs_by_time ON runs (started_at)",
            """CREATE TABLE pins (
                name TEXT NOT NULL, run_id INTEGER NOT NULL, pinned_at REAL NOT NULL,
                PRIMARY KEY (name, run_id))""",
        ),
    ),
    (
        2,
        "steal time of each run",
        # earlier runs keep NULL: they did not measure it (their load JSON has no steal_share)
        ("ALTER TABLE runs ADD COLUMN steal_share REAL",),
    ),
    (
        3,
        "ranks of a job",
        # earlier runs keep NULL: they ran alone (no torchrun job)
        (
            "ALTER TABLE runs ADD COLUMN rank INTEGER",
            "ALTER TABLE runs ADD COLUMN world_size INTEGER",
            "ALTER TABLE runs ADD COLUMN job_id TEXT",
            "CREATE INDEX runs_by_job ON runs (job_id, rank)",
        ),
    ),
    (
        4,
        "configuration of each run",
        (
            "ALTER TABLE runs ADD COLUMN config TEXT",
            "ALTER TABLE runs ADD COLUMN other_cpu_share REAL",
            "CREATE INDEX runs_by_config ON runs (name, hardware, config, id)",
            _backfill_configurations,
        ),
    ),
]
