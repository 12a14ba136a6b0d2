"""A PostgreSQL server as the run store, against a real server the tests start themselves
(tests/support/postgres.py: a throwaway cluster on a Unix socket, one for the whole run, a new
database per test): the store suite both backends pass, many writers, a second shell comparing
with the first's runs, the server stopped while a cell runs, credentials in no output, the gates
and moving runs between a SQLite file and the server."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from postgres import SECRET_PASSWORD, SECRET_USER
from store_helpers import REPO, cli, make_run, train
from store_suite import StoreDb, StoreSuite

import traceml_nb
from traceml_nb.analysis.noise import is_busy
from traceml_nb.session.store import Store, StoreError
from traceml_nb.session.store_transfer import export_lines, import_lines


@pytest.fixture
def db(postgres_cluster):
    """A new, empty database of the server (as its superuser)."""
    return StoreDb("postgresql", postgres_cluster.url(postgres_cluster.new_database()))


class TestPostgresStore(StoreSuite):
    """The store's behaviour on a PostgreSQL server."""


# --- a server that goes away --------------------------------------------------------------------
def test_the_server_stopped_while_a_cell_runs_never_fails_it(postgres_cluster, capsys):
    url = postgres_cluster.url(postgres_cluster.new_database())
    session = traceml_nb.Session(store=url)
    first = train(session, "stops")
    assert first.stored_id == 1
    try:
        stopped = train(session, "stops", during=postgres_cluster.stop_server)
    finally:
        postgres_cluster.start_server()
    note = stopped.store_note
    assert note and "\n" not in note and note in stopped.capabilities.notes
    assert note.startswith(f"this run was not stored: cannot reach the store server {url} (")
    assert stopped.stored_id is None and len(session.history) == 2  # kept in the session
    assert "this run was not stored" in str(stopped)  # the report says it
    again = train(session, "stops")  # the server is back
    assert again.stored_id is not None and Store(url).count("stops") == 2


def test_an_unreachable_server_is_one_line_and_asked_once(postgres_cluster):
    store = Store("postgresql://nobody@127.0.0.1:1/runs")  # nothing listens on port 1
    with pytest.raises(StoreError) as info:
        store.add(make_run())
    why = str(info.value)
    assert why.startswith("cannot reach the store server postgresql://nobody@127.0.0.1:1/runs (")
    assert "\n" not in why
    started = time.perf_counter()
    with pytest.raises(StoreError, match=re.escape(why)):
        store.rows()  # the same store does not wait for the server again
    assert time.perf_counter() - started < 0.5


def test_a_server_that_never_answers_the_connection_costs_one_connect_timeout():
    """A port that accepts TCP connections (the kernel's backlog) and never says a word."""
    from traceml_nb.session.store_postgres import STORE_CONNECT_TIMEOUT_S

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql://nobody@127.0.0.1:{silent.getsockname()[1]}/runs"
        store = Store(url)
        started = time.perf_counter()
        with pytest.raises(StoreError) as info:
            store.add(make_run())
        waited = time.perf_counter() - started
        assert STORE_CONNECT_TIMEOUT_S - 0.5 <= waited < STORE_CONNECT_TIMEOUT_S + 10
        assert str(info.value).startswith(f"cannot reach the store server {url} (")
        assert "timeout" in str(info.value)
        started = time.perf_counter()
        with pytest.raises(StoreError):
            store.rows()  # not asked again: the run's other reads cost nothing more
        assert time.perf_counter() - started < 0.5


@pytest.fixture
def holder(postgres_cluster):
    """A database with a stored run, and a connection of another client to it."""
    import psycopg

    url = postgres_cluster.url(postgres_cluster.new_database())
    Store(url).add(make_run("held"))
    with psycopg.connect(url, autocommit=True) as conn:
        yield url, conn


def test_a_table_locked_by_another_client_costs_the_lock_timeout_then_a_cell_stores_again(
    holder,
):
    url, other = holder
    other.execute("BEGIN")
    other.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")  # e.g. a VACUUM FULL
    session = traceml_nb.Session(store=url)
    started = time.perf_counter()
    locked = train(session, "held")
    assert time.perf_counter() - started < 60  # its reads and write each gave up
    assert locked.stored_id is None
    assert locked.store_note == (
        f"this run was not stored: the store {url} stayed locked by another writer for 3 s"
    )
    other.execute("COMMIT")
    again = train(session, "held")
    assert again.stored_id == 2 and again.store_note is None


def test_a_statement_the_server_never_answers_is_given_up_and_not_asked_again(holder, monkeypatch):
    from traceml_nb.session import store_postgres

    url, other = holder
    monkeypatch.setattr(store_postgres, "STORE_STATEMENT_TIMEOUT_S", 1)
    other.execute(
        "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$"
    )
    other.execute(
        "CREATE TRIGGER stall BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION stall()"
    )
    store = Store(url)
    started = time.perf_counter()
    with pytest.raises(StoreError) as info:
        store.add(make_run("held"))
    assert time.perf_counter() - started < 30
    assert str(info.value).startswith(f"the store server {url} did not answer within 1 s (")
    started = time.perf_counter()
    with pytest.raises(StoreError, match="did not answer"):
        store.rows()  # the same store does not wait for it again
    assert time.perf_counter() - started < 0.5
    assert Store(url).count() == 1  # nothing half-written


def test_a_connection_cut_mid_statement_is_not_asked_again(holder):
    """The server ends our connection while a write waits (an administrator's
    ``pg_terminate_backend``, as a restart does): one line, and the same store does not ask
    again."""
    import threading

    url, other = holder
    other.execute("BEGIN")
    other.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")  # the write waits here
    store = Store(url, timeout_s=60)  # the lock waits until the cut, however busy the machine

    def cut() -> None:  # a third client: the holder's transaction sees one snapshot of stats
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                pids = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'traceml_nb' "
                    "AND wait_event_type = 'Lock'"
                ).fetchall()
                if pids:
                    admin.execute("SELECT pg_terminate_backend(%s)", pids[0])
                    return
                time.sleep(0.02)

    cutter = threading.Thread(target=cut)
    cutter.start()
    try:
        with pytest.raises(StoreError) as info:
            store.add(make_run("held"))
    finally:
        cutter.join()
        other.execute("COMMIT")
    assert "\n" not in str(info.value) and "stayed locked" not in str(info.value)
    started = time.perf_counter()
    with pytest.raises(StoreError, match=re.escape(str(info.value))):
        store.rows()  # not asked again
    assert time.perf_counter() - started < 0.5
    assert Store(url).count() == 1  # a new store asks, and the server is there


def test_a_full_disk_and_a_lock_on_the_server_are_said_as_such():
    """The server's own error classes, as psycopg raises them (a real full disk:
    test_store_full_disk.py; a real lock: above)."""
    import psycopg.errors

    store = Store("postgresql://ann:hunter2@db/runs")
    backend = store._backend
    full = psycopg.errors.DiskFull('could not extend file "base/1/2": No space left on device')
    assert backend.explain(full).startswith(
        "the disk or memory of the store server postgresql://ann:***@db/runs is full ("
    )
    locked = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    assert "stayed locked by another writer for 3 s" in backend.explain(locked)
    echoed = psycopg.ProgrammingError('invalid dsn: "postgresql://ann:hunter2@db/runs" bad')
    assert "hunter2" not in backend.explain(echoed)


# --- credentials --------------------------------------------------------------------------------
def test_credentials_appear_in_no_output(postgres_cluster, monkeypatch, capsys):
    name = postgres_cluster.new_database(owner=SECRET_USER)
    with_password = postgres_cluster.url(name, SECRET_USER, SECRET_PASSWORD)
    without = postgres_cluster.url(name, SECRET_USER)
    seen: list[str] = []
    session = traceml_nb.Session(store=with_password)
    for _ in range(3):
        result = train(session, "secret")
        seen += [str(result), repr(result), repr(session.store()), *result.capabilities.notes]
    assert result.stored_id == 3
    # PGPASSWORD, as libpq reads it: the CLI's gates and listings through the server
    env = {"PGPASSWORD": SECRET_PASSWORD}
    for args in (
        ("check", "--name", "secret", "--store", without),
        ("check", "--name", "secret", "--history", "--store", without),
        ("check", "--name", "nothing", "--store", with_password),
        ("export", "--store", without),
    ):
        done = cli(*args, env=env)
        # any of the gate's answers (three short real runs on a loaded machine may read
        # slower); what this test asks is what the output shows, and that nothing crashed
        assert done.returncode in (0, 1, 2, 3) and "Traceback" not in done.stderr, done.stderr
        seen += [done.stdout, done.stderr]
    # wrong credentials: one line saying so
    for bad in (postgres_cluster.url(name, SECRET_USER, "not-" + SECRET_PASSWORD), without):
        monkeypatch.delenv("PGPASSWORD", raising=False)
        done = cli("check", "--name", "secret", "--store", bad, env={"PGPASSWORD": ""})
        assert done.returncode == 2 and "cannot read the store" in done.stdout + done.stderr
        seen += [done.stdout, done.stderr]
    with pytest.raises(StoreError, match="refused the credentials") as info:
        Store(postgres_cluster.url(name, SECRET_USER, "x" + SECRET_PASSWORD)).count()
    seen.append(str(info.value))
    from traceml_nb.views.history_table import StoredHistory

    seen.append(StoredHistory.of(Store(with_password)).text)
    seen.append(capsys.readouterr().out)
    # the store itself: every row of every table, as text
    admin = StoreDb("postgresql", postgres_cluster.url(name))
    tables = [r[0] for r in admin.sql("SELECT tablename FROM pg_tables WHERE schemaname='public'")]
    assert {"runs", "pins", "schema_migrations"} <= set(tables)
    for table in tables:
        seen += [repr(row) for row in admin.sql(f"SELECT * FROM {table}")]
    assert any("***" in text for text in seen)  # the URL is shown, its password hidden
    leaked = [text for text in seen if SECRET_PASSWORD in text]
    assert leaked == []


# --- many processes, one server -----------------------------------------------------------------
SHELL = r"""
import json, sys
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "traceml_nb")
for cell in json.loads(sys.stdin.read()):
    print("=== cell", flush=True)
    assert ip.run_cell(cell).success
"""
LOOP = """\
%%traceml --view text --name shared
import time, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
ds = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(ds, batch_size=4):
    time.sleep(0.01)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def shell(cells: list[str], url: str, cwd) -> list[str]:
    """The outputs of ``cells`` in a real IPython shell of a new process storing to ``url``."""
    done = subprocess.run(
        [sys.executable, "-c", SHELL],
        input=json.dumps(cells),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TRACEML_NB_STORE=url),
        cwd=str(cwd),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("=== cell\n")[1:]


def test_a_second_shell_compares_with_the_first_shells_runs_through_the_server(
    postgres_cluster, tmp_path
):
    """Both runs of the first shell are the baseline; on a machine with other work (a CI
    runner), a quiet third run is judged against the quiet ones only (``_quiet_first``), so
    the test expects what the runs' own measured loads make the baseline."""
    url = postgres_cluster.url(postgres_cluster.new_database())
    first = shell([LOOP, LOOP], url, tmp_path)
    assert "this run was not stored" not in "".join(first)
    (second,) = shell([LOOP], url, tmp_path)
    runs = Store(url).rows()
    assert [(r.id, r.name) for r in runs] == [(1, "shared"), (2, "shared"), (3, "shared")]
    assert runs[0].session == runs[1].session != runs[2].session
    baseline = [r.id for r in runs[:2]]
    if not is_busy(runs[2].load) and any(not is_busy(r.load) for r in runs[:2]):
        baseline = [r.id for r in runs[:2] if not is_busy(r.load)]
    which = "2 runs" if len(baseline) == 2 else "1 run"
    ids = "\u2013".join(f"@{i}" for i in baseline)
    line = next(x for x in second.splitlines() if x.startswith("vs baseline"))
    assert line.startswith(
        f"vs baseline: {which} of this configuration of 'shared' ({ids}), from an earlier "
        "session: step time "
    ), second


# --- the gates, the history, moving runs --------------------------------------------------------
def test_check_history_and_pins_work_against_the_server(db):
    empty = traceml_nb.check("smoke", store=db.target).result  # a new database: nothing stored
    assert (empty.exit_code, empty.status) == (2, "no baseline")
    assert empty.why == (
        f"no stored run named 'smoke' in {db.target} (the store is empty: no run was stored yet)"
    )
    store = db.store()
    for i, median in enumerate([20.0, 20.2, 19.8, 20.1, 19.9]):
        store.add(make_run("smoke", step_ms=median, seed=i))
    store.add(make_run("smoke", step_ms=30.0, seed=12, source="train(loader)\nsleep(0.010)\n"))
    done = cli("check", "--name", "smoke", "--store", db.target)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("REGRESSION: 'smoke' @6 is slower than its baseline, 5 runs")
    assert traceml_nb.check("smoke", store=db.target, against="@1").exit_code == 1
    store.pin("smoke", [1, 2])
    from traceml_nb.session.shifts import check_history, name_shifts
    from traceml_nb.views.history_table import StoredHistory

    store.add(make_run("smoke", step_ms=36.0, seed=13, batch_size=16))  # read from the summary
    assert name_shifts(store, "smoke").batch_sizes == [8] * 6 + [16]
    assert check_history("smoke", store=db.target).status == "too short"
    listed = StoredHistory.of(store, name="smoke")
    assert listed.stored == 7 and f"store: {db.target}" in listed.text
    assert "smoke" in StoredHistory.of(store).text


def test_runs_move_between_a_sqlite_file_and_the_server_each_once(db, tmp_path):
    sqlite = Store(tmp_path / "laptop.sqlite")
    for i in range(3):
        entry = make_run("smoke", seed=i, step_ms=20.0 + i)
        entry.started_at += 60.0 * i
        sqlite.add(entry, session="laptop")
    lines = list(export_lines(sqlite))
    server = db.store()
    server.add(make_run("other"), session="server")  # @1 there already
    added = import_lines(server, lines)
    assert (added.added, added.already) == (3, 0)
    assert list(export_lines(server, "smoke")) == lines
    assert (import_lines(server, lines).added, server.count()) == (0, 4)  # twice: nothing added
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(line + "\n" for line in export_lines(server)))
    done = cli("import", str(path), "--store", str(tmp_path / "back.sqlite"))
    assert done.returncode == 0, done.stderr
    assert list(export_lines(Store(tmp_path / "back.sqlite"), "smoke")) == lines
    again = cli("import", str(path), "--store", db.target)
    assert again.returncode == 0, again.stderr
    assert "0 run(s) added" in again.stdout and "4 already there" in again.stdout
    assert str(REPO)  # the CLI ran from the repository
