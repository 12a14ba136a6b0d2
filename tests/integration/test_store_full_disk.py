"""A full disk, for real: a tmpfs of 512 KiB mounted by the test (tests/support/small_disk.py)
under a SQLite store's folder, and under a PostgreSQL tablespace that holds the ``runs`` table.
A run that cannot be written is reported and kept in the session with one note saying the disk
is full; what was stored stays readable; once space is freed the next run is stored."""

from __future__ import annotations

import pytest
from small_disk import small_disk
from store_helpers import make_run, train

import traceml_nb
from traceml_nb.session.store import Store, StoreError


def test_a_sqlite_store_on_a_full_disk(tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        if isinstance(disk, str):
            pytest.skip(disk)
        path = disk.path / "runs.sqlite"
        session = traceml_nb.Session(store=str(path))
        assert train(session, "full").stored_id == 1
        disk.fill()
        with pytest.raises(StoreError) as info:
            Store(path).add(make_run("full", steps=20_000))
        assert str(info.value).startswith(f"the disk holding the store {path} is full (")
        full = train(session, "full")
        assert full.stored_id is None and len(session.history) == 2  # kept in the session
        assert full.store_note == f"this run was not stored: {info.value}"
        assert [r.id for r in Store(path).rows()] == [1]  # what was stored is still read
        disk.free()
        assert train(session, "full").stored_id == 2


def test_a_postgresql_store_whose_disk_is_full(postgres_cluster):
    import psycopg

    name = postgres_cluster.new_database()
    folder = postgres_cluster.root / f"disk-{name}"  # where the server's user can reach
    with small_disk(folder, owner=postgres_cluster.server_ids()) as disk:
        if isinstance(disk, str):
            pytest.skip(disk)
        url = postgres_cluster.url(name)
        session = traceml_nb.Session(store=url)
        assert train(session, "full").stored_id == 1
        space = f"small_{name}"
        postgres_cluster.admin(f"CREATE TABLESPACE {space} LOCATION '{disk.path}'")
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"ALTER TABLE runs SET TABLESPACE {space}")
                conn.execute("ALTER TABLE runs SET (fillfactor = 10)")  # a run: a new page
            disk.fill()
            full = train(session, "full")
            assert full.stored_id is None and len(session.history) == 2
            assert full.store_note.startswith(
                f"this run was not stored: the disk or memory of the store server {url} is "
                "full (could not extend file "
            ), full.store_note
            assert "No space left on device" in full.store_note
            assert [r.id for r in Store(url).rows()] == [1]
            disk.free()
            assert train(session, "full").stored_id is not None
            assert Store(url).count("full") == 2
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ALTER TABLE runs SET TABLESPACE pg_default")
            postgres_cluster.admin(f"DROP DATABASE {name}")
            postgres_cluster.admin(f"DROP TABLESPACE {space}")
