"""The run store: every finished run in a database, across sessions, processes and machines.

Where: ``--store PATH`` or ``--store postgresql://user@host:port/db`` (the magic, the CLI) or
``TRACEML_NB_STORE``; ``--no-store`` or ``TRACEML_NB_STORE=off`` turns it off; by default
``$XDG_DATA_HOME/traceml_nb/runs.sqlite``, else ``~/.local/share/traceml_nb/runs.sqlite``
(:func:`resolve_store_path`).

How: one interface, two backends: a SQLite file (:mod:`.store_sqlite`, the embedded default: the
WAL journal, on a network or FUSE filesystem the rollback journal and a failed write retried once
after ``NETWORK_RETRY_S``) or a PostgreSQL server (:mod:`.store_postgres`). One short
transaction per run written, so several kernels, CI jobs and machines writing at once lose
nothing. The schema has a version and a ``schema_migrations`` table; :data:`MIGRATIONS` bring an
older store up to date in one transaction. A run is written once, at its end, never while it
trains. Any failure is a :class:`StoreError` whose message is one line saying why (never a
password); the session turns it into a note and the user's cell is never failed by it.

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

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from ..settings import store_setting, xdg_data_home
from .history import RunEntry
from .store_backend import Backend, Connection, StoreEmpty, StoreError, one_line
from .store_postgres import PostgresBackend
from .store_rows import (
    LIST_COLUMNS,
    NameTotals,
    StoredRow,
    batch_size_of,
    entry_of,
    row_of,
    values_given_of,
)
from .store_schema import MIGRATIONS, RUN_COLUMNS, SCHEMA_VERSION
from .store_sqlite import SqliteBackend
from .store_url import is_url

__all__ = ["Store", "StoreEmpty", "StoreError", "default_store_path", "resolve_store_path"]

T = TypeVar("T")

#: Values of ``TRACEML_NB_STORE`` that turn the store off (any case).
OFF_VALUES = frozenset({"off", "no", "none", "false", "0"})
#: Seconds a writer waits for another writer's transaction (or a migration's lock) before
#: giving up ("locked").
BUSY_TIMEOUT_S = 3.0
#: Seconds before the one retry of a write that failed on a network or FUSE filesystem.
NETWORK_RETRY_S = 0.5
#: What tells a run apart in any store: its name, start (epoch s), the session that measured
#: it and its number in that session.
RunKey = tuple[str, float, str | None, int | None]


def default_store_path() -> str:
    """``$XDG_DATA_HOME/traceml_nb/runs.sqlite`` (an absolute XDG_DATA_HOME only, as the XDG
    specification says), else ``~/.local/share/traceml_nb/runs.sqlite``."""
    base = xdg_data_home()
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "traceml_nb", "runs.sqlite")


def _resolved(value: str) -> str:
    """A URL as given, a path made absolute."""
    value = value.strip() if is_url(value) else value
    return value if is_url(value) else os.path.abspath(os.path.expanduser(value))


def resolve_store_path(option: str | os.PathLike[str] | bool | None = None) -> str | None:
    """The store's path (or server URL, as given), or ``None`` when storing is off.

    ``option``: a path or URL (``--store``), ``False`` (``--no-store``), or ``None``/``True``
    for ``TRACEML_NB_STORE`` (a path, a URL, or ``off``), else :func:`default_store_path`.
    """
    if option is False:
        return None
    if option is not None and option is not True:
        return _resolved(os.fspath(option))
    value = store_setting()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return _resolved(value)
    return default_store_path()


class Store:
    """The run store at ``path``: a SQLite file, or a ``postgresql://`` URL (see the module
    docstring).

    ``create_dir``: create the file's directory when it is missing (done for the default path;
    a path the user chose must exist, so a typo is told rather than silently created).
    ``timeout_s``: seconds a writer waits for another's transaction or migration.
    Every method opens its own short-lived connection: a store is safe to share between
    threads, and many processes can use one store. ``path`` is what may be shown: a server
    URL's password is hidden in it (:func:`~.store_url.redacted`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create_dir: bool = False,
        timeout_s: float = BUSY_TIMEOUT_S,
    ) -> None:
        target = os.fspath(path)
        self._backend: Backend
        if is_url(target):
            server = PostgresBackend(target, timeout_s=timeout_s)
            self.path = server.shown
            self._backend = server
        else:
            self.path = os.path.abspath(target)
            self._backend = SqliteBackend(self.path, create_dir=create_dir, timeout_s=timeout_s)
        self.create_dir = create_dir
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"<traceml_nb Store {self.path}>"

    @property
    def server(self) -> bool:
        """The store is a database server's (not a file of this machine)."""
        return isinstance(self._backend, PostgresBackend)

    @property
    def network(self) -> bool | None:
        """The store is a file on a network or FUSE filesystem (None: not opened yet)."""
        return self._backend.network

    @network.setter
    def network(self, value: bool | None) -> None:
        self._backend.network = value

    def exists(self) -> bool:
        """Whether there is a store to read: a file that is there, or a server (which says
        itself when it has no store)."""
        return self._backend.exists()

    # --- opening ----------------------------------------------------------------------------
    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[Connection]:
        backend = self._backend
        with backend.connect(write) as conn:
            try:
                self._prepare(conn, write)
                yield conn
            except backend.errors as exc:
                raise StoreError(backend.failed(exc)) from None

    def _prepare(self, conn: Connection, write: bool) -> None:
        backend = self._backend
        version = backend.version(conn)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store {self.path} has schema version {version}, written by a newer "
                f"traceml_nb; this one reads version {SCHEMA_VERSION}"
            )
        backend.configure(conn, write)
        if version == SCHEMA_VERSION:
            return
        if not write and version == 0:
            raise StoreEmpty(f"the store {self.path} is empty (no run was stored yet)")
        # an older schema is migrated on reading too (``check`` may be the first to open a store
        # after an upgrade): the queries name the newer columns
        backend.lock_schema(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = backend.version(conn)  # another may have won
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
                    except StoreError:
                        raise
                    except backend.errors:
                        raise
                    except Exception as exc:  # a fault of the step's: the store is left as it was
                        raise StoreError(
                            f"migrating the store {self.path} to schema version {number} "
                            f"failed: {type(exc).__name__}: {one_line(exc)}"
                        ) from None
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (number, description, time.time()),
                )
                backend.set_version(conn, number)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        backend.unlock_schema(conn)
        backend.migrated(conn)

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
        """Write ``entries`` in one transaction (``%traceml load`` of a history file); on a
        network filesystem a failed write is tried once more after ``NETWORK_RETRY_S``."""
        try:
            return self._insert(entries, session)
        except StoreError:
            if not self.network:
                raise
        time.sleep(NETWORK_RETRY_S)
        return self._insert(entries, session)

    def _insert(self, entries: Sequence[RunEntry], session: str | None) -> list[int]:
        columns = RUN_COLUMNS
        rows = [row_of(e, session, columns) for e in entries]
        marks = ", ".join("?" * len(columns))
        sql = f"INSERT INTO runs ({', '.join(columns)}) VALUES ({marks})"
        ids = []
        with self._connect(write=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for row in rows:
                    ids.append(self._backend.insert(conn, sql, row))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return ids

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
        sql = f"SELECT {LIST_COLUMNS} FROM runs {where} ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._connect() as conn:
            found = conn.execute(sql, args).fetchall()
        return [StoredRow(*row) for row in reversed(found)]

    def batch_sizes(self, name: str) -> dict[int, int | None]:
        """The median batch size (samples a step) of every stored run of ``name``, by run id,
        read from its summary (None: the run could not count its samples)."""
        return self._read_each(name, "summary", batch_size_of)

    def values_given(self, name: str) -> dict[int, dict[str, str]]:
        """The values every stored run of ``name`` was given (:func:`~traceml_nb.analysis.
        variants.values_of`: notebook values, a script's arguments' hash), by run id."""
        return self._read_each(name, "environment", values_given_of)

    def _read_each(self, name: str, column: str, read: Callable[[str], T]) -> dict[int, T]:
        """``read`` of one JSON ``column`` of every stored run of ``name``, by run id."""
        with self._connect() as conn:
            found = conn.execute(f"SELECT id, {column} FROM runs WHERE name = ?", [name]).fetchall()
        return {int(run_id): read(text) for run_id, text in found}

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
        if not ids:
            return []
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
                f"SELECT {LIST_COLUMNS} FROM runs WHERE name = ? AND job_id IS NOT NULL "
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
                f"SELECT {LIST_COLUMNS} FROM runs {where} ORDER BY id", args
            ).fetchall()
        return [StoredRow(*row) for row in found]

    # --- moving runs between stores (:mod:`.store_transfer`) ----------------------------------
    def keyed_entries(self, name: str | None = None) -> list[tuple[RunEntry, RunKey]]:
        """Every stored run of ``name`` (every name: None) in full, in store order, with its
        :data:`RunKey`: what tells one run apart in any store."""
        where, args = ("WHERE name = ? ORDER BY id", [name]) if name else ("ORDER BY id", [])
        columns = "id, session_run, " + ", ".join(RUN_COLUMNS)
        with self._connect() as conn:
            found = conn.execute(f"SELECT {columns} FROM runs {where}", args).fetchall()
        out = []
        for row in found:
            entry = entry_of((row[0], *row[2:]), RUN_COLUMNS)
            out.append((entry, (entry.name, entry.started_at, entry.session_id, row[1])))
        return out

    def add_new(self, runs: Sequence[tuple[RunEntry, RunKey]]) -> tuple[int, int]:
        """Add the ``runs`` whose key is not stored yet, in one transaction, each under its
        own session and number in it; returns (added, already stored)."""
        columns = RUN_COLUMNS
        sql = f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        seen = (
            "SELECT 1 FROM runs WHERE name = ? AND started_at = ? AND session IS ? "
            "AND session_run IS ? LIMIT 1"
        )
        added = 0
        with self._connect(write=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for entry, key in runs:
                    if conn.execute(seen, key).fetchall():
                        continue
                    numbered = replace(entry, id=key[3] or 0)
                    conn.execute(sql, row_of(numbered, key[2], columns))
                    added += 1
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return added, len(runs) - added

    def _entries(self, where: str, args: Sequence[Any]) -> list[RunEntry]:
        columns = "id, " + ", ".join(RUN_COLUMNS)
        with self._connect() as conn:
            found = conn.execute(f"SELECT {columns} FROM runs {where}", list(args)).fetchall()
        return [entry_of(row, RUN_COLUMNS) for row in found]
