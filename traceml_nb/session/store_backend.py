"""What the run store asks of a database. :class:`~.store.Store` holds the store's SQL, its
migrations and its queries, written once in SQLite's dialect; a backend opens connections that
take that SQL (:mod:`.store_sqlite`, the embedded file; :mod:`.store_postgres`, a server, which
translates it) and does the few things each database does its own way: the schema's version,
the lock a migration holds, the id of an inserted row, the words of its errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol


class StoreError(Exception):
    """The store could not be used; the message is one line saying why."""


class StoreEmpty(StoreError):
    """The store has no schema yet: nothing was ever stored in it (a new server database)."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


class Connection(Protocol):
    """An open connection, as the store's SQL and its migration steps use it."""

    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any: ...


class Backend(Protocol):
    """One kind of database under :class:`~.store.Store`."""

    #: the database's own exceptions, turned into :class:`StoreError` by :meth:`failed`
    errors: tuple[type[BaseException], ...]
    #: the store is a file on a network or FUSE filesystem (None: not looked at yet)
    network: bool | None

    def connect(self, write: bool) -> AbstractContextManager[Connection]:
        """A connection in autocommit mode (the store begins its own transactions), closed
        at the end; :class:`StoreError` when none can be had."""
        ...

    def explain(self, exc: BaseException) -> str:
        """One line saying why, naming the store (never its password)."""
        ...

    def failed(self, exc: BaseException) -> str:
        """:meth:`explain` for an error raised while the store used a connection, kept where it
        tells the backend's next connections something (a server that stopped answering)."""
        ...

    def exists(self) -> bool:
        """Whether there is a store to read (a file that is not there yet has no runs)."""
        ...

    def version(self, conn: Connection) -> int:
        """The schema version of the store (0: nothing made yet)."""
        ...

    def configure(self, conn: Connection, write: bool) -> None:
        """Settings of a new connection, before the schema is looked at."""
        ...

    def lock_schema(self, conn: Connection) -> None:
        """Before a migration's transaction (which reads the version again): hold off every
        other migration until :meth:`unlock_schema` (or the connection's end)."""
        ...

    def unlock_schema(self, conn: Connection) -> None:
        """After a migration committed: let the next one in."""
        ...

    def set_version(self, conn: Connection, number: int) -> None:
        """In a migration's transaction: the store is now of version ``number``."""
        ...

    def migrated(self, conn: Connection) -> None:
        """After a migration committed."""
        ...

    def insert(self, conn: Connection, sql: str, row: Sequence[Any]) -> int:
        """Run the ``INSERT`` ``sql`` of one run; the store id it got."""
        ...
