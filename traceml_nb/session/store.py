"""The run store: every finished run in a local SQLite database, across sessions and processes.

Where: ``--store PATH`` (the magic, the CLI) or ``TRACEML_NB_STORE=PATH``; ``--no-store`` or
``TRACEML_NB_STORE=off`` turns it off; by default ``$XDG_DATA_HOME/traceml_nb/runs.sqlite``,
else ``~/.local/share/traceml_nb/runs.sqlite`` (:func:`resolve_store_path`).

How: the standard library's ``sqlite3``, the WAL journal (readers never block the writer),
``synchronous=NORMAL``, a busy timeout of ``BUSY_TIMEOUT_S`` seconds, one short ``BEGIN
IMMEDIATE`` transaction per run written, so several kernels and CI jobs writing at once lose
nothing. The schema has a version (``PRAGMA user_version``) and a ``schema_migrations`` table;
:data:`MIGRATIONS` bring an older file up to date in one transaction. A run is written once, at
its end, never while it trains. Any failure is a :class:`StoreError` whose message is one line
saying why; the session turns it into a note and the user's cell is never failed by it.

Per run: the summary and the diagnosis (JSON), up to ``MAX_STORED_STEPS`` steady step times
(float32, ms), the DataLoader settings, the cell source, the environment
(:mod:`.environment`), the machine load and the idle-GPU cost; ~20 KB for a run with 4,000
kept steps. Columns of their own, for queries: the figures ``%traceml history`` lists and
``steal_share`` (schema 2), the share 0..1 of the machine's CPU time the hypervisor took during
the run (steal time; NULL where the kernel reports none, and for runs stored before schema 2);
``rank``, ``world_size`` and ``job_id`` (schema 3) of a run in a ``torchrun`` job (``RANK``,
``WORLD_SIZE``, ``TORCHELASTIC_RUN_ID``; NULL for a run alone and for earlier runs);
``config``, the key of the run's configuration (:mod:`traceml_nb.analysis.configuration`), and
``other_cpu_share``, the share 0..1 of the machine's CPUs other processes used (schema 4;
computed for earlier runs from what they stored).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..analysis.findings import Diagnosis, Summary
from ..settings import store_setting, xdg_data_home
from .environment import hardware_class
from .history import RunEntry, run_configuration

#: Values of ``TRACEML_NB_STORE`` that turn the store off (any case).
OFF_VALUES = frozenset({"off", "no", "none", "false", "0"})
#: Seconds a writer waits for another writer's transaction before giving up ("locked").
BUSY_TIMEOUT_S = 3.0
#: Seconds between attempts to switch a new store to the WAL journal (``Store._use_wal``).
WAL_RETRY_S = 0.01
#: The schema this traceml_nb reads and writes.
SCHEMA_VERSION = 4

_RUN_COLUMNS = (
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


def _backfill_configurations(conn: sqlite3.Connection) -> None:
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
            share = _share((json.loads(load).get("load") or {}).get("other_cpu_share"))
        except (ValueError, TypeError, AttributeError):
            share = None
        updates.append((config, share, run_id))
    conn.executemany("UPDATE runs SET config = ?, other_cpu_share = ? WHERE id = ?", updates)


def _share(value: Any) -> float | None:
    """A stored share as a column: a finite number, else NULL."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


#: (version, what it does, steps): applied in order to a file of an older version; a step is an
#: SQL statement or a function of the connection, run inside the same transaction.
MIGRATIONS: list[tuple[int, str, tuple[str | Callable[[sqlite3.Connection], None], ...]]] = [
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


class StoreError(Exception):
    """The store could not be used; the message is one line saying why."""


def default_store_path() -> str:
    """``$XDG_DATA_HOME/traceml_nb/runs.sqlite`` (an absolute XDG_DATA_HOME only, as the XDG
    specification says), else ``~/.local/share/traceml_nb/runs.sqlite``."""
    base = xdg_data_home()
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "traceml_nb", "runs.sqlite")


def resolve_store_path(option: str | os.PathLike[str] | bool | None = None) -> str | None:
    """The store's path, or ``None`` when storing is off.

    ``option``: a path (``--store PATH``), ``False`` (``--no-store``), or ``None``/``True`` for
    ``TRACEML_NB_STORE`` (a path, or ``off``), else :func:`default_store_path`.
    """
    if option is False:
        return None
    if option is not None and option is not True:
        return os.path.abspath(os.path.expanduser(os.fspath(option)))
    value = store_setting()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    return default_store_path()


@dataclass
class StoredRow:
    """One stored run as ``%traceml history --all`` lists it (no steps, no source)."""

    id: int  #: the store's run id (shown as ``@id``)
    name: str
    status: str
    started_at: float  #: epoch seconds
    elapsed_s: float
    hardware: str  #: :func:`~.environment.hardware_class`
    total_steps: int | None
    steady_steps: int | None
    step_ms_median: float | None
    samples_per_s: float | None
    data_wait_share: float | None
    gpu_util_median_pct: float | None
    verdict: str | None
    idle_gpu_s: float | None  #: idle accelerator seconds (None: CPU run or not measured)
    idle_cost_usd: float | None  #: their price (None: no price for this GPU)
    session: str | None
    session_run: int | None  #: the run's number in its session
    #: share 0..1 of the machine's CPU time the hypervisor took (steal time; None: not measured)
    steal_share: float | None = None
    #: the rank, world size and job id of a run in a ``torchrun`` job (schema 3; None: alone)
    rank: int | None = None
    world_size: int | None = None
    job_id: str | None = None
    #: the run's configuration key and the share 0..1 of the CPUs other processes used (schema 4)
    config: str | None = None
    other_cpu_share: float | None = None

    @property
    def load(self) -> dict[str, float | None]:
        """The machine's load during the run as a run's ``load`` holds it (for
        :func:`~traceml_nb.analysis.noise.is_busy`)."""
        return {"other_cpu_share": self.other_cpu_share, "steal_share": self.steal_share}


@dataclass
class NameTotals:
    """A name's stored runs since a time: how many, and the idle GPU time they left."""

    name: str
    runs: int
    idle_gpu_s: float  #: sum over the runs that measured it
    idle_cost_usd: float  #: sum over the runs that had a price
    priced_runs: int


_LIST_COLUMNS = (
    "id, name, status, started_at, elapsed_s, hardware, total_steps, steady_steps, "
    "step_ms_median, samples_per_s, data_wait_share, gpu_util_median_pct, verdict, "
    "idle_gpu_s, idle_cost_usd, session, session_run, steal_share, rank, world_size, job_id, "
    "config, other_cpu_share"
)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(_finite(value), allow_nan=False, separators=(",", ":"), default=str)


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


class Store:
    """The SQLite run store at ``path`` (see the module docstring).

    ``create_dir``: create the file's directory when it is missing (done for the default path;
    a path the user chose must exist, so a typo is told rather than silently created).
    Every method opens its own short-lived connection: a store is safe to share between
    threads, and many processes can use one file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create_dir: bool = False,
        timeout_s: float = BUSY_TIMEOUT_S,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.create_dir = create_dir
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"<traceml_nb Store {self.path}>"

    # --- opening ----------------------------------------------------------------------------
    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            if not (self.create_dir and write):
                raise StoreError(f"the store's directory {folder} does not exist")
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the store's directory {folder}: {_why(exc)}"
                ) from None
        if not write and not os.path.exists(self.path):
            raise StoreError(f"there is no store at {self.path} yet")
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {_why(exc)}") from None
        try:
            try:
                self._prepare(conn, write)
            except sqlite3.DatabaseError as exc:
                raise StoreError(self._explain(exc)) from None
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(self._explain(exc)) from None
        finally:
            conn.close()

    def _explain(self, exc: sqlite3.Error) -> str:
        why = _why(exc)
        if "not a database" in why or "malformed" in why:
            return f"the store {self.path} is not a readable SQLite database ({why})"
        if "locked" in why or "busy" in why:
            return f"the store {self.path} stayed locked by another writer for {self.timeout_s:g} s"
        if "readonly" in why or "read-only" in why:
            return f"the store {self.path} is read-only ({why})"
        if "full" in why:
            return f"the disk holding the store {self.path} is full ({why})"
        return f"the store {self.path} failed: {why}"

    def _prepare(self, conn: sqlite3.Connection, write: bool) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store {self.path} has schema version {version}, written by a newer "
                f"traceml_nb; this one reads version {SCHEMA_VERSION}"
            )
        conn.execute("PRAGMA synchronous=NORMAL")
        if version == SCHEMA_VERSION:
            return
        if not write and version == 0:
            raise StoreError(f"the store {self.path} is empty (no run was stored yet)")
        # an older schema is migrated on reading too (``check`` may be the first to open a store
        # after an upgrade): the queries name the newer columns
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # another may have won
            if version == 0:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations "
                    "(version INTEGER PRIMARY KEY, description TEXT, applied_at REAL)"
                )
            for number, description, statements in MIGRATIONS:
                if number <= version:
                    continue
                for statement in statements:
                    if not callable(statement):
                        conn.execute(statement)
                        continue
                    try:
                        statement(conn)
                    except (sqlite3.Error, StoreError):
                        raise
                    except Exception as exc:  # a fault of the step's: the file is left as it was
                        raise StoreError(
                            f"migrating the store {self.path} to schema version {number} "
                            f"failed: {type(exc).__name__}: {_why(exc)}"
                        ) from None
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (number, description, time.time()),
                )
                conn.execute(f"PRAGMA user_version = {int(number)}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._use_wal(conn)

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to the WAL journal (it stays so). Outside a transaction, as SQLite
        requires; and SQLite answers "locked" at once, without its busy timeout, while another
        process writes (two kernels creating one store together), so this waits up to the busy
        timeout itself."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(WAL_RETRY_S)

    def schema(self) -> list[tuple[int, str]]:
        """The migrations applied to this file: ``(version, description)``, oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT version, description FROM schema_migrations ORDER BY version"
            ).fetchall()
        return [(int(v), str(d)) for v, d in rows]

    # --- writing ----------------------------------------------------------------------------
    def add(self, entry: RunEntry, *, session: str | None = None) -> int:
        """Write ``entry`` (one transaction); returns its store id. :class:`StoreError` saying
        why it could not be written."""
        return self.add_many([entry], session=session)[0]

    def add_many(self, entries: Sequence[RunEntry], *, session: str | None = None) -> list[int]:
        """Write ``entries`` in one transaction (``%traceml load`` of a history file)."""
        columns = _RUN_COLUMNS
        rows = [self._row(e, session, columns) for e in entries]
        marks = ", ".join("?" * len(columns))
        sql = f"INSERT INTO runs ({', '.join(columns)}) VALUES ({marks})"
        ids = []
        with self._connect(write=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for row in rows:
                    cursor = conn.execute(sql, row)
                    assert cursor.lastrowid is not None
                    ids.append(int(cursor.lastrowid))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return ids

    @staticmethod
    def _row(e: RunEntry, session: str | None, columns: Sequence[str]) -> tuple[Any, ...]:
        s, d = e.summary, e.diagnosis
        cost = e.cost or {}
        values = {
            "name": e.name,
            "named": int(e.named),
            "cell_id": e.cell_id,
            "status": e.status,
            "error": e.error,
            "started_at": float(e.started_at),
            "elapsed_s": float(e.elapsed_s),
            "hardware": hardware_class(e.environment),
            "session": session,
            "session_run": e.id or None,
            "total_steps": s.total_steps,
            "steady_steps": s.steady_steps,
            "step_ms_median": _finite(s.step_ms_median),
            "samples_per_s": _finite(s.samples_per_s),
            "data_wait_share": _finite(s.data_wait_share),
            "gpu_util_median_pct": _finite(s.gpu_util_median_pct),
            "verdict": d.verdict,
            "cause": d.cause,
            "idle_gpu_s": _finite(cost.get("idle_gpu_s")),
            "idle_cost_usd": _finite(cost.get("cost_usd")),
            "source": e.source,
            "summary": _dumps(s.to_dict()),
            "diagnosis": _dumps(d.to_dict()),
            "loaders": _dumps(e.loaders),
            "environment": _dumps(e.environment),
            "load": _dumps({"load": e.load, "cost": e.cost}),
            "step_ms": array("f", e.step_ms).tobytes(),
            "steal_share": _finite(e.load.get("steal_share")),
            "rank": e.rank,
            "world_size": e.world_size,
            "job_id": e.job_id,
            "config": e.configuration.key,
            "other_cpu_share": _share(e.load.get("other_cpu_share")),
        }
        return tuple(values[c] for c in columns)

    # --- pinned baselines --------------------------------------------------------------------
    def pin(self, name: str, run_ids: Sequence[int]) -> None:
        """Make ``run_ids`` the baseline of ``name`` (replacing an earlier pin); each must be a
        stored run of that name, else :class:`StoreError`."""
        with self._connect(write=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for run_id in run_ids:
                    found = conn.execute("SELECT name FROM runs WHERE id = ?", (run_id,)).fetchone()
                    if found is None:
                        raise StoreError(f"no stored run @{run_id}")
                    if found[0] != name:
                        raise StoreError(f"stored run @{run_id} is {found[0]!r}, not {name!r}")
                conn.execute("DELETE FROM pins WHERE name = ?", (name,))
                now = time.time()
                conn.executemany(
                    "INSERT INTO pins VALUES (?, ?, ?)", [(name, int(i), now) for i in run_ids]
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def unpin(self, name: str) -> int:
        """Drop the pinned baseline of ``name``; returns how many runs it had."""
        with self._connect(write=True) as conn:
            return conn.execute("DELETE FROM pins WHERE name = ?", (name,)).rowcount

    def pins(self, name: str) -> list[int]:
        """The pinned baseline of ``name`` (store ids, oldest first); [] when none."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT run_id FROM pins WHERE name = ? ORDER BY run_id", (name,)
            ).fetchall()
        return [int(r[0]) for r in rows]

    # --- reading ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The names of the stored runs, latest run first."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT name FROM runs GROUP BY name ORDER BY MAX(id) DESC"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def count(self, name: str | None = None) -> int:
        """How many runs are stored (of ``name``, when given)."""
        where, args = ("WHERE name = ?", [name]) if name is not None else ("", [])
        with self._connect() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM runs {where}", args).fetchone()[0])

    def rows(self, *, name: str | None = None, limit: int | None = None) -> list[StoredRow]:
        """Stored runs, oldest first (the latest ``limit`` when given), of ``name`` or all."""
        where, args = ("WHERE name = ?", [name]) if name is not None else ("", [])
        sql = f"SELECT {_LIST_COLUMNS} FROM runs {where} ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._connect() as conn:
            found = conn.execute(sql, args).fetchall()
        return [StoredRow(*row) for row in reversed(found)]

    def totals(self, *, since: float, name: str | None = None) -> list[NameTotals]:
        """Per name, the runs started at or after ``since`` (epoch s) and their idle GPU time."""
        where = "WHERE started_at >= ?" + (" AND name = ?" if name is not None else "")
        args: list[Any] = [since] + ([name] if name is not None else [])
        with self._connect() as conn:
            found = conn.execute(
                "SELECT name, COUNT(*), COALESCE(SUM(idle_gpu_s), 0), "
                "COALESCE(SUM(idle_cost_usd), 0), COUNT(idle_cost_usd) "
                f"FROM runs {where} GROUP BY name ORDER BY name",
                args,
            ).fetchall()
        return [NameTotals(str(n), int(c), float(s), float(u), int(p)) for n, c, s, u, p in found]

    def get(self, run_id: int) -> RunEntry:
        """The stored run ``run_id`` in full; :class:`StoreError` when there is none."""
        found = self._entries("WHERE id = ?", [int(run_id)])
        if not found:
            raise StoreError(f"no stored run @{run_id} in {self.path}")
        return found[0]

    def entries(self, run_ids: Sequence[int]) -> list[RunEntry]:
        """The stored runs ``run_ids`` in full, in store order (ids not stored are left out)."""
        ids = [int(i) for i in run_ids]
        return self._entries(f"WHERE id IN ({', '.join('?' * len(ids))}) ORDER BY id", ids)

    def job_runs(self, job_id: str, *, name: str | None = None) -> list[RunEntry]:
        """Every stored run of the ``torchrun`` job ``job_id`` (of ``name``, when given) in full,
        in rank order (a rank stored twice, by an elastic restart, in store order)."""
        where, args = "WHERE job_id = ?", [job_id]
        if name is not None:
            where, args = where + " AND name = ?", [*args, name]
        return self._entries(f"{where} ORDER BY rank, id", args)

    def job_rows(self, name: str) -> list[StoredRow]:
        """The stored runs of ``name`` that are ranks of a ``torchrun`` job, oldest first."""
        with self._connect() as conn:
            found = conn.execute(
                f"SELECT {_LIST_COLUMNS} FROM runs WHERE name = ? AND job_id IS NOT NULL "
                "ORDER BY id",
                [name],
            ).fetchall()
        return [StoredRow(*row) for row in found]

    def latest(self, name: str, *, hardware: str | None = None) -> RunEntry | None:
        """The latest stored run of ``name`` (on ``hardware`` when given)."""
        where, args = "WHERE name = ?", [name]
        if hardware is not None:
            where, args = where + " AND hardware = ?", [*args, hardware]
        found = self._entries(f"{where} ORDER BY id DESC LIMIT 1", args)
        return found[0] if found else None

    def baseline(
        self,
        name: str,
        *,
        hardware: str | None,
        before: int | None = None,
        k: int = 5,
        alone: bool = False,
        rank_of: tuple[int, int, str] | None = None,
        config: str | None = None,
    ) -> list[RunEntry]:
        """The baseline of a run of ``name``: its pinned runs when it has a pin (whatever their
        configuration), else the last ``k`` completed runs of ``name`` with at least two steady
        steps, stored before store id ``before``, on ``hardware`` (``None``: any class), only
        runs that ran alone (no ranks of a ``torchrun`` job) with ``alone``, only the same rank
        of other jobs of the same world size with ``rank_of=(rank, world_size, job_id)``, only
        runs of the configuration key ``config`` when given; oldest first."""
        pinned = self.pins(name)
        if pinned:
            marks = ", ".join("?" * len(pinned))
            return self._entries(f"WHERE id IN ({marks}) ORDER BY id", pinned)
        where = "WHERE name = ? AND status = 'completed' AND steady_steps >= 2"
        args: list[Any] = [name]
        if alone:
            where += " AND job_id IS NULL"
        if rank_of is not None:
            where += " AND rank = ? AND world_size = ? AND job_id IS NOT ?"
            args += list(rank_of)
        if hardware is not None:
            where += " AND hardware = ?"
            args.append(hardware)
        if config is not None:
            where += " AND config = ?"
            args.append(config)
        if before is not None:
            where += " AND id < ?"
            args.append(int(before))
        found = self._entries(f"{where} ORDER BY id DESC LIMIT {int(k)}", args)
        return found[::-1]

    def class_rows(self, hardware: str, *, before: int | None = None) -> list[StoredRow]:
        """Every completed run with a median step on the hardware class ``hardware`` (all
        names; stored before id ``before`` when given), oldest first: what the noise model
        pools over (:mod:`.baselines`)."""
        where = "WHERE hardware = ? AND status = 'completed' AND step_ms_median IS NOT NULL"
        args: list[Any] = [hardware]
        if before is not None:
            where += " AND id < ?"
            args.append(int(before))
        with self._connect() as conn:
            found = conn.execute(
                f"SELECT {_LIST_COLUMNS} FROM runs {where} ORDER BY id", args
            ).fetchall()
        return [StoredRow(*row) for row in found]

    def _entries(self, where: str, args: Sequence[Any]) -> list[RunEntry]:
        columns = "id, " + ", ".join(_RUN_COLUMNS)
        with self._connect() as conn:
            found = conn.execute(f"SELECT {columns} FROM runs {where}", list(args)).fetchall()
        return [_entry(row) for row in found]


def _entry(row: Sequence[Any]) -> RunEntry:
    data = dict(zip(("id", *_RUN_COLUMNS), row, strict=True))
    extra = json.loads(data["load"])
    load = extra.get("load") or {}
    if data.get("steal_share") is not None:  # the column is the store's own record of it
        load["steal_share"] = float(data["steal_share"])
    steps = array("f")
    steps.frombytes(data["step_ms"])
    return RunEntry(
        id=int(data["id"]),
        name=data["name"],
        cell_id=data["cell_id"],
        source=data["source"],
        status=data["status"],
        error=data["error"],
        started_at=float(data["started_at"]),
        elapsed_s=float(data["elapsed_s"]),
        summary=Summary.from_dict(json.loads(data["summary"])),
        diagnosis=Diagnosis.from_dict(json.loads(data["diagnosis"])),
        step_ms=[float(v) for v in steps],
        loaders=json.loads(data["loaders"]),
        named=bool(data["named"]),
        environment=json.loads(data["environment"]),
        load=load,
        cost=extra.get("cost"),
        stored_id=int(data["id"]),
        origin="store",
        session_id=data["session"],
        rank=data["rank"],
        world_size=data["world_size"],
        job_id=data["job_id"],
    )
