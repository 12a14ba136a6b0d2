"""The SQLite run store, on real files: the suite both backends pass
(tests/support/store_suite.py: schema and migrations, round trips, baselines, many writers at
once), paths and URLs, and every way a file can be unusable (each one a StoreError of one
line)."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest
from store_helpers import make_read_only, make_run, python, undo_read_only
from store_suite import StoreDb, StoreSuite

from traceml_nb.analysis.thresholds import MAX_STORED_STEPS
from traceml_nb.session.store import (
    BUSY_TIMEOUT_S,
    SCHEMA_VERSION,
    Store,
    StoreError,
    default_store_path,
    resolve_store_path,
)
from traceml_nb.session.store_postgres import dialect
from traceml_nb.session.store_url import is_server_url, password_of, redacted


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "runs.sqlite")


# --- paths ------------------------------------------------------------------------------------
def test_the_default_path_is_in_the_user_data_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_store_path() == str(tmp_path / ".local/share/traceml_nb/runs.sqlite")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == str(tmp_path / "xdg/traceml_nb/runs.sqlite")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # the XDG spec: ignore a relative one
    assert default_store_path() == str(tmp_path / ".local/share/traceml_nb/runs.sqlite")


def test_the_path_option_and_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEML_NB_STORE", str(tmp_path / "env.sqlite"))
    assert resolve_store_path() == str(tmp_path / "env.sqlite")
    assert resolve_store_path(tmp_path / "opt.sqlite") == str(tmp_path / "opt.sqlite")
    assert resolve_store_path(False) is None
    for off in ("off", "OFF", "none", "0", "false"):
        monkeypatch.setenv("TRACEML_NB_STORE", off)
        assert resolve_store_path() is None
        assert resolve_store_path(tmp_path / "x.sqlite") == str(tmp_path / "x.sqlite")
    monkeypatch.delenv("TRACEML_NB_STORE")
    assert resolve_store_path() == default_store_path()


def test_tests_never_use_the_users_data_directory():
    assert os.environ["TRACEML_NB_STORE"] != default_store_path()
    assert "/.local/share/" not in os.environ["TRACEML_NB_STORE"]


# --- server URLs -----------------------------------------------------------------------------
def test_a_server_url_is_taken_as_given(monkeypatch):
    url = "postgresql://ann:pw@db.example:5432/runs"
    assert resolve_store_path(url) == url
    assert resolve_store_path(f"  {url} ") == url
    monkeypatch.setenv("TRACEML_NB_STORE", "postgres://ann@db/runs?host=/tmp/sock")
    assert resolve_store_path() == "postgres://ann@db/runs?host=/tmp/sock"
    assert is_server_url(url) and is_server_url("POSTGRES://x/y")
    assert not is_server_url("/tmp/runs.sqlite") and not is_server_url("mysql://a@b/c")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://ann:s3cr%40t@db:5432/runs", "postgresql://ann:***@db:5432/runs"),
        ("postgresql://ann:@db/runs", "postgresql://ann:***@db/runs"),
        ("postgres://ann@db/runs?password=pw&sslmode=require", None),
        ("postgresql://ann@db/runs", "postgresql://ann@db/runs"),
        ("postgresql:///runs?host=/tmp/sock", "postgresql:///runs?host=/tmp/sock"),
        ("postgresql://ann:pw@[::1/runs", "postgresql://ann:***@[::1/runs"),  # does not parse
        ("/home/ann/runs.sqlite", "/home/ann/runs.sqlite"),
    ],
)
def test_a_password_is_never_shown(url, shown):
    hidden = redacted(url)
    if shown is not None:
        assert hidden == shown
    secret = password_of(url)
    if secret:
        assert secret not in hidden and "***" in hidden
    assert password_of("postgresql://ann:s3cr%40t@db/runs") == "s3cr@t"
    assert "pw" not in redacted("postgres://ann@db/runs?password=pw&sslmode=require")


def test_a_server_store_shows_its_url_without_the_password():
    store = Store("postgresql://ann:hunter2@db.example:5432/runs")
    assert store.path == "postgresql://ann:***@db.example:5432/runs" and store.server
    assert "hunter2" not in repr(store) and "hunter2" not in repr(store.__dict__)
    assert store.exists() and store.network is False


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("mysql://ann:hunter2@db/runs", "has the scheme 'mysql'; a store is a file path or"),
        ("postgresql://ann:hunter2@db:port/runs", "is malformed: Port could not be cast"),
        ("postgresql://ann:hunter2@[::1/runs", "is malformed: its host does not parse"),
    ],
)
def test_a_bad_store_url_is_a_store_error_of_one_line(url, why):
    with pytest.raises(StoreError) as info:
        Store(url).add(make_run())
    assert why in one_line(info) and "hunter2" not in one_line(info)


def test_the_store_sql_in_postgresqls_dialect():
    assert dialect("BEGIN IMMEDIATE") == "BEGIN"
    assert dialect("SELECT 1 FROM runs WHERE session IS ? AND job_id IS NOT ? AND id < ?") == (
        "SELECT 1 FROM runs WHERE session IS NOT DISTINCT FROM %s "
        "AND job_id IS DISTINCT FROM %s AND id < %s"
    )
    made = dialect("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, x REAL, b BLOB)")
    assert made == (
        "CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
        "x DOUBLE PRECISION, b BYTEA)"
    )
    assert dialect("ALTER TABLE runs ADD COLUMN steal_share REAL").endswith("DOUBLE PRECISION")


def test_psycopg_is_imported_only_for_a_server_url(tmp_path):
    out = python(
        f"""
        import sys
        from traceml_nb.session.store import Store
        Store({str(tmp_path / "runs.sqlite")!r}).add
        import traceml_nb.session.session, traceml_nb.session.check
        print("psycopg" in sys.modules)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --- the suite both backends pass (tests/support/store_suite.py) ---------------------------------
@pytest.fixture
def db(tmp_path):
    return StoreDb("sqlite", str(tmp_path / "runs.sqlite"))


class TestSqliteStore(StoreSuite):
    """The store's behaviour on a SQLite file."""


# --- SQLite's own -----------------------------------------------------------------------------
def test_a_new_store_uses_the_wal_journal_and_pragma_user_version(store):
    store.add(make_run())
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_a_run_takes_at_most_50_kb(store, tmp_path):
    """4,000 kept steps as float32 (16 KB), the summary, the diagnosis, a 3 KB cell."""
    source = "x = 1\n" * 500
    for i in range(20):
        entry = make_run(steps=MAX_STORED_STEPS + 100, seed=i, source=source)
        assert len(entry.step_ms) == MAX_STORED_STEPS
        store.add(entry)
    conn = sqlite3.connect(store.path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    per_run = os.path.getsize(store.path) / 20
    assert per_run <= 50_000, per_run


# --- unusable stores: one line each ------------------------------------------------------------
def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


def test_a_corrupt_store(tmp_path):
    path = tmp_path / "corrupt.sqlite"
    path.write_bytes(b"this is not a database, just some bytes\n" * 100)
    with pytest.raises(StoreError) as info:
        Store(path).add(make_run())
    assert "is not a readable SQLite database" in one_line(info)


def test_a_missing_directory(tmp_path):
    with pytest.raises(StoreError) as info:
        Store(tmp_path / "no" / "such" / "dir" / "runs.sqlite").add(make_run())
    assert "does not exist" in one_line(info)
    created = Store(tmp_path / "made" / "runs.sqlite", create_dir=True)
    created.add(make_run())  # the default path's directory is created
    assert created.count() == 1


def test_an_io_error_is_a_full_disk_only_with_little_room_left(tmp_path, monkeypatch):
    """SQLite says "disk I/O error" where a full disk keeps it from making its WAL index
    (tests/integration/test_store_full_disk.py has the real one): read as a full disk only
    under FULL_DISK_FREE_BYTES free."""
    from traceml_nb.session import store_sqlite

    backend = store_sqlite.SqliteBackend(
        str(tmp_path / "runs.sqlite"), create_dir=False, timeout_s=1
    )
    error = sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(backend, "_free_bytes", lambda: store_sqlite.FULL_DISK_FREE_BYTES)
    assert backend.explain(error) == f"the store {backend.path} failed: disk I/O error"
    monkeypatch.setattr(backend, "_free_bytes", lambda: store_sqlite.FULL_DISK_FREE_BYTES - 1)
    assert backend.explain(error) == (
        f"the disk holding the store {backend.path} is full (disk I/O error; 1024 KiB free)"
    )
    monkeypatch.setattr(backend, "_free_bytes", lambda: None)  # the disk cannot be asked
    assert backend.explain(error).endswith("failed: disk I/O error")


def test_a_locked_store(tmp_path):
    path = tmp_path / "locked.sqlite"
    Store(path).add(make_run())
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.perf_counter()
        with pytest.raises(StoreError) as info:
            Store(path, timeout_s=0.5).add(make_run())
        assert time.perf_counter() - started >= 0.4  # it waited for the other writer first
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "stayed locked by another writer" in one_line(info)
    assert BUSY_TIMEOUT_S >= 1.0


def test_a_read_only_store(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "runs.sqlite"
    store = Store(path)
    store.add(make_run())
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")  # no -wal/-shm files left beside it
    conn.close()
    make_read_only(path)
    try:
        with pytest.raises(StoreError) as info:
            store.add(make_run())
        assert store.path in one_line(info)
        assert "read-only" in one_line(info) or "readonly" in one_line(info)
    finally:
        undo_read_only(path)


def test_reading_a_store_that_does_not_exist_says_so(tmp_path):
    with pytest.raises(StoreError, match="there is no store at"):
        Store(tmp_path / "none.sqlite").rows()


def test_the_environment_of_a_real_run_is_captured(tmp_path):
    out = python(
        """
        import torch, traceml_nb
        from torch.utils.data import DataLoader, TensorDataset
        from traceml_nb.session.environment import capture_environment, hardware_class
        ds = TensorDataset(torch.randn(32, 4), torch.zeros(32, dtype=torch.long))
        m = torch.nn.Linear(4, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with traceml_nb.Run("env", sample=False) as run:
            for x, y in DataLoader(ds, batch_size=4):
                torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
        env = capture_environment(run)
        print(repr(env))
        print(hardware_class(env))
        """,
        env={"TRACEML_NB_STORE": "off"},
    )
    assert out.returncode == 0, out.stderr
    env = eval(out.stdout.splitlines()[0])  # noqa: S307 (our own repr of plain data)
    assert env["dataset_type"] == "TensorDataset" and env["dataset_len"] == 32
    assert env["gpu_name"] is None  # a CPU run
    assert env["torch_version"] and env["python_version"] and env["cpus_available"] >= 1
    assert len(env["host_hash"]) == 12
    assert len(env["git_commit"] or "") == 40 and env["git_dirty"] in (True, False)
    assert out.stdout.splitlines()[1].startswith("CPU: ")


def test_a_real_runs_steal_time_reaches_the_summary_the_load_and_the_store(tmp_path):
    """A real CPU run with the host sampler: the kernel's steal time (Linux) is measured, a
    share of the machine's CPU time, and stored in its column; elsewhere it is unavailable
    with the sampler's reason, never 0."""
    import psutil
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from traceml_nb.session.session import Session

    store = Store(tmp_path / "runs.sqlite")
    session = Session(store=store.path)
    ds = TensorDataset(torch.randn(64, 4), torch.zeros(64, dtype=torch.long))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session.run("steal", interval=0.05) as run:
        for x, y in DataLoader(ds, batch_size=2):
            time.sleep(0.01)  # 32 steps, ~0.4 s: several host samples
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    result = run.result()
    entry = session.history.entries[-1]
    stored = store.get(result.stored_id)
    if getattr(psutil.cpu_times(), "steal", None) is not None:
        assert run.capabilities.ok("steal_time")
        assert 0.0 <= entry.load["steal_share"] <= 1.0
        assert 0.0 <= result.summary.steal_mean_pct <= 100.0
        assert stored.load["steal_share"] == pytest.approx(entry.load["steal_share"])
        assert store.rows()[-1].steal_share == pytest.approx(entry.load["steal_share"])
    else:
        assert entry.load["steal_share"] is None and result.summary.steal_mean_pct is None
        assert result.summary.unavailable["steal_mean_pct"] == run.capabilities.why("steal_time")
    assert stored.summary.steal_mean_pct == result.summary.steal_mean_pct


def test_a_failing_comparison_still_reports_and_stores_the_run(tmp_path, monkeypatch):
    """A bug in the comparisons costs the comparisons only: the run is analysed, reported
    with one note saying why nothing is compared, and stored."""
    import torch

    from traceml_nb.session.session import Session

    store = Store(tmp_path / "runs.sqlite")
    session = Session(store=store.path)

    def broken(self, entry, target):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(Session, "_comparisons", broken)
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(16, 4))
    model = torch.nn.Linear(4, 2)
    for _ in range(2):
        with session.run("broken", sample=False) as run:
            for (x,) in DataLoader(ds, batch_size=2):
                model(x).sum().backward()
        result = run.result()
    assert result.comparisons == [] and result.baseline is None
    assert (
        "comparisons with earlier runs unavailable (ZeroDivisionError: float division by zero)"
        in run.capabilities.notes
    )
    assert result.stored_id is not None and len(store.rows()) == 2
