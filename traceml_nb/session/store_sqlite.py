"""The embedded store: a SQLite file, through the standard library's ``sqlite3``.

The WAL journal (readers never block the writer; on a network or FUSE filesystem such as a
mounted Drive the rollback journal instead: :mod:`.store_place`), ``synchronous=NORMAL``, a
busy timeout (the store's ``timeout_s``). The schema's version is ``PRAGMA user_version``; a
migration holds the file's write lock (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .store_backend import Connection, StoreError, one_line
from .store_place import on_network_filesystem

#: Bytes free on the store's filesystem under which a write's I/O error is read as a full disk:
#: a new connection's WAL index (32 KiB) or a journal that cannot be made fails as "disk I/O
#: error", not "database or disk is full".
FULL_DISK_FREE_BYTES = 1_048_576
#: Seconds between attempts to switch a new store to the WAL journal (:meth:`SqliteBackend.
#: _use_journal`).
WAL_RETRY_S = 0.01


class SqliteBackend:
    """The SQLite file at ``path`` (absolute). ``create_dir``: make its directory when missing
    (the default path's; a path the user chose must exist, so that a typo is told);
    ``timeout_s``: seconds a writer waits for another's transaction."""

    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: str, *, create_dir: bool, timeout_s: float) -> None:
        self.path = path
        self.create_dir = create_dir
        self.timeout_s = timeout_s
        self.network: bool | None = None

    @contextmanager
    def connect(self, write: bool) -> Iterator[Connection]:
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            if not (self.create_dir and write):
                raise StoreError(f"the store's directory {folder} does not exist")
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the store's directory {folder}: {one_line(exc)}"
                ) from None
        if not write and not os.path.exists(self.path):
            raise StoreError(f"there is no store at {self.path} yet")
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {one_line(exc)}") from None
        if not write:
            try:
                conn = self._readable(conn)
            except sqlite3.Error as exc:
                conn.close()
                raise StoreError(self.explain(exc)) from None
        try:
            yield conn
        finally:
            conn.close()

    def _readable(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """``conn``, or where a full disk leaves no room for the WAL index that a reader of a
        WAL store must make, the file opened as it is (``immutable``): with no WAL file beside
        it (or an empty one), every committed run is in the file, and what was stored stays
        readable."""
        try:
            conn.execute("PRAGMA user_version").fetchall()
            return conn
        except sqlite3.OperationalError as exc:
            no_index = getattr(exc, "sqlite_errorname", "") == "SQLITE_IOERR_SHMSIZE"
            if not no_index or self._wal_bytes() > 0:
                raise
        conn.close()
        uri = f"file:{urllib.parse.quote(self.path)}?immutable=1"
        return sqlite3.connect(uri, uri=True, isolation_level=None)

    def explain(self, exc: BaseException) -> str:
        why = one_line(exc)
        if "not a database" in why or "malformed" in why:
            return f"the store {self.path} is not a readable SQLite database ({why})"
        if "locked" in why or "busy" in why:
            return f"the store {self.path} stayed locked by another writer for {self.timeout_s:g} s"
        if "readonly" in why or "read-only" in why:
            return f"the store {self.path} is read-only ({why})"
        if "full" in why:
            return f"the disk holding the store {self.path} is full ({why})"
        free = self._free_bytes()
        if "I/O error" in why and free is not None and free < FULL_DISK_FREE_BYTES:
            name = getattr(exc, "sqlite_errorname", "")
            said = f"{why}: {name}" if name else why
            left = f"{free / 1024:.0f} KiB free"
            return f"the disk holding the store {self.path} is full ({said}; {left})"
        return f"the store {self.path} failed: {why}"

    def _wal_bytes(self) -> int:
        try:
            return os.path.getsize(self.path + "-wal")
        except OSError:
            return 0

    def _free_bytes(self) -> int | None:
        """Bytes free to us on the store's filesystem; None when that cannot be read."""
        try:
            stat = os.statvfs(os.path.dirname(self.path))
        except OSError:
            return None
        return stat.f_bavail * stat.f_frsize

    def failed(self, exc: BaseException) -> str:
        return self.explain(exc)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def version(self, conn: Connection) -> int:
        return int(conn.execute("PRAGMA user_version").fetchall()[0][0])

    def configure(self, conn: Connection, write: bool) -> None:
        conn.execute("PRAGMA synchronous=NORMAL")
        if self.network is None:
            self.network = on_network_filesystem(self.path)
        if self.network and write:
            self._use_journal(conn, "delete")

    def lock_schema(self, conn: Connection) -> None:
        """Nothing: the migration's ``BEGIN IMMEDIATE`` holds the file's write lock."""

    def unlock_schema(self, conn: Connection) -> None:
        """Nothing: its ``COMMIT`` let the lock go."""

    def set_version(self, conn: Connection, number: int) -> None:
        conn.execute(f"PRAGMA user_version = {int(number)}")

    def migrated(self, conn: Connection) -> None:
        self._use_journal(conn, "delete" if self.network else "wal")

    def insert(self, conn: Connection, sql: str, row: Sequence[Any]) -> int:
        cursor = conn.execute(sql, row)
        assert cursor.lastrowid is not None
        return int(cursor.lastrowid)

    def _use_journal(self, conn: Connection, mode: str) -> None:
        """Switch the file to the ``mode`` journal ("wal", or "delete" on a network
        filesystem; it stays so) unless it is in it. Outside a transaction, as SQLite
        requires; and SQLite answers "locked" at once, without its busy timeout, while another
        process writes (two kernels creating one store together), so this waits up to the busy
        timeout itself."""
        if conn.execute("PRAGMA journal_mode").fetchall()[0][0].lower() == mode:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                conn.execute(f"PRAGMA journal_mode={mode.upper()}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(WAL_RETRY_S)
