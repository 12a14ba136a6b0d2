"""The SQLite run store, on real files: schema and migrations, round trips, paths, many
writers at once, and every way a store can be unusable (each one a StoreError of one line)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time

import pytest
from store_helpers import ENV, make_read_only, make_run, python, undo_read_only

from traceml_nb.analysis.configuration import configuration_of
from traceml_nb.analysis.thresholds import MAX_STORED_STEPS
from traceml_nb.session import store as store_mod
from traceml_nb.session.environment import hardware_class
from traceml_nb.session.store import (
    BUSY_TIMEOUT_S,
    SCHEMA_VERSION,
    Store,
    StoreError,
    default_store_path,
    resolve_store_path,
)


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


# --- schema -----------------------------------------------------------------------------------
def test_a_new_store_has_the_schema_the_wal_journal_and_its_migrations(store):
    store.add(make_run())
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    assert store.schema() == [
        (1, "runs and pinned baselines"),
        (2, "steal time of each run"),
        (3, "ranks of a job"),
        (4, "configuration of each run"),
    ]


def test_a_store_of_an_older_version_is_migrated(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite"
    sqlite3.connect(path).close()  # an empty file: version 0
    extra = (5, "a test column", ("ALTER TABLE runs ADD COLUMN test_extra TEXT",))
    Store(path).add(make_run())  # the current version
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, extra])
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", 5)
    Store(path).add(make_run())
    assert Store(path).schema() == [
        (1, "runs and pinned baselines"),
        (2, "steal time of each run"),
        (3, "ranks of a job"),
        (4, "configuration of each run"),
        (5, "a test column"),
    ]
    assert Store(path).count() == 2
    columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(runs)")]
    assert "test_extra" in columns


#: the columns added after schema 1
LATER_COLUMNS = ("steal_share", "rank", "world_size", "job_id", "config", "other_cpu_share")


def _write_version_1_store(path, monkeypatch, entries) -> None:
    """A store as traceml_nb wrote it at schema 1 (before steal time had a column)."""
    with monkeypatch.context() as m:
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:1])
        m.setattr(store_mod, "SCHEMA_VERSION", 1)
        m.setattr(
            store_mod,
            "RUN_COLUMNS",
            tuple(c for c in store_mod.RUN_COLUMNS if c not in LATER_COLUMNS),
        )
        assert "steal_share" not in store_mod.RUN_COLUMNS
        old = Store(path)
        old.add_many(entries, session="old")
        old.pin("smoke", [1, 2])
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    columns = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    conn.close()
    assert "steal_share" not in columns


@pytest.mark.parametrize("first_use", ["write", "read"])
def test_a_version_1_store_migrates_to_steal_time_and_loses_nothing(
    tmp_path, monkeypatch, first_use
):
    path = tmp_path / "v1.sqlite"
    entries = [make_run(seed=i, step_ms=20.0 + i, load=0.1 * i) for i in range(3)]
    entries[2].cost = {"idle_gpu_s": 3.0, "cost_usd": 0.002}
    _write_version_1_store(path, monkeypatch, entries)
    store = Store(path)
    if first_use == "write":  # a run of the new version: stored with its steal time
        newer = make_run(seed=9)
        newer.load["steal_share"] = 0.12
        assert store.add(newer) == 4
    else:  # `check` or `history --all` may be the first to open it after an upgrade
        assert store.count() == 3
    assert store.schema() == [
        (1, "runs and pinned baselines"),
        (2, "steal time of each run"),
        (3, "ranks of a job"),
        (4, "configuration of each run"),
    ]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    steal = conn.execute("SELECT steal_share FROM runs ORDER BY id").fetchall()
    conn.close()
    assert steal[:3] == [(None,), (None,), (None,)]  # earlier runs did not measure it
    for stored_id, entry in enumerate(entries, start=1):
        back = store.get(stored_id)
        assert back.summary == entry.summary and back.diagnosis == entry.diagnosis
        assert back.environment == entry.environment and back.loaders == entry.loaders
        assert back.load == entry.load and "steal_share" not in back.load
        assert back.cost == entry.cost and back.session_id == "old"
        assert back.step_ms == pytest.approx(entry.step_ms, rel=1e-6)
    assert store.pins("smoke") == [1, 2]
    rows = store.rows()
    assert [r.id for r in rows][:3] == [1, 2, 3] and rows[0].steal_share is None
    if first_use == "write":
        assert steal[3] == (pytest.approx(0.12),)
        assert store.get(4).load["steal_share"] == pytest.approx(0.12)
        assert rows[3].steal_share == pytest.approx(0.12)


def _write_version_3_store(path, monkeypatch, entries) -> None:
    """A store as traceml_nb wrote it at schema 3 (before configurations): migrations 1-3 and
    the rows ``Store._row`` made then (no ``config``, no ``other_cpu_share`` column)."""
    with monkeypatch.context() as m:
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:3])
        m.setattr(store_mod, "SCHEMA_VERSION", 3)
        m.setattr(
            store_mod,
            "RUN_COLUMNS",
            tuple(c for c in store_mod.RUN_COLUMNS if c not in ("config", "other_cpu_share")),
        )
        Store(path).add_many(entries, session="v3")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    columns = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    conn.close()
    assert "job_id" in columns and "config" not in columns


def _version_3_runs() -> list:
    """Runs of every kind of code and configuration part, as schema 3 stored them."""
    named = make_run("smoke", seed=0, load=0.25)
    again = make_run("smoke", seed=1, load=None)  # the same configuration, load not sampled
    edited = make_run("smoke", seed=2, source="train(loader)\nlog()\n")
    workers = make_run("smoke", seed=3, num_workers=2)
    other_hw = make_run("smoke", seed=4, env=dict(ENV, cpu_model="Other CPU"))
    newer_torch = make_run("smoke", seed=5, env=dict(ENV, torch_version="2.4.0"))
    script = make_run("job", seed=6, source=None, env=dict(ENV, script_sha="0123456789abcdef"))
    git = make_run("job", seed=7, source=None, env=dict(ENV, git_commit="a" * 40, git_dirty=False))
    unknown = make_run("job", seed=8, source=None)  # no script, outside git: code unknown
    unnamed = make_run("cell [3]", seed=9)  # the fallback name of a cell given none
    unnamed.named = False
    crashed = make_run("smoke", seed=10, status="interrupted")
    crashed.load = {}  # nothing sampled
    return [
        named,
        again,
        edited,
        workers,
        other_hw,
        newer_torch,
        script,
        git,
        unknown,
        unnamed,
        crashed,
    ]


def _columns(path, *names) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT {', '.join(names)} FROM runs ORDER BY id").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("first_use", ["write", "read"])
def test_a_version_3_store_gets_the_configuration_of_every_run(tmp_path, monkeypatch, first_use):
    path = tmp_path / "v3.sqlite"
    entries = _version_3_runs()
    _write_version_3_store(path, monkeypatch, entries)
    store = Store(path)
    if first_use == "write":  # a new run of the first run's configuration
        newer = make_run("smoke", seed=11, load=0.5)
        assert store.add(newer) == len(entries) + 1
    else:  # `check` or `history --all` may be the first to open it after an upgrade
        assert store.count() == len(entries)
    assert store.schema()[-1] == (4, "configuration of each run") and SCHEMA_VERSION == 4
    stored = _columns(path, "config", "other_cpu_share")
    keys = [key for key, _ in stored]
    # every run kept, keyed as a new run of its configuration is keyed
    assert keys[: len(entries)] == [e.configuration.key for e in entries]
    first = entries[0]
    assert (
        keys[0]
        == configuration_of(
            first.name, first.source, first.loaders, first.environment, hardware_class(ENV)
        ).key
    )
    assert keys[0] == keys[1] and len(set(keys[:10])) == 9  # only the rerun shares a key
    assert keys[10] == keys[0]  # an interrupted run has its configuration too
    assert [share for _, share in stored][: len(entries)] == [0.25, None] + [0.0] * 8 + [None]
    for stored_id, entry in enumerate(entries, start=1):
        back = store.get(stored_id)
        assert back.summary == entry.summary and back.environment == entry.environment
        assert back.loaders == entry.loaders and back.load == entry.load
        assert back.source == entry.source and back.session_id == "v3"
        assert back.configuration == entry.configuration
    rows = store.rows()
    assert [r.config for r in rows][: len(entries)] == keys[: len(entries)]
    assert rows[0].other_cpu_share == 0.25 and rows[1].other_cpu_share is None
    if first_use == "write":
        assert keys[-1] == keys[0] and rows[-1].other_cpu_share == 0.5
    conn = sqlite3.connect(path)
    index = [r[2] for r in conn.execute("PRAGMA index_info(runs_by_config)")]
    conn.close()
    assert index == ["name", "hardware", "config", "id"]


def test_a_stored_run_the_migration_cannot_read_gets_no_configuration(tmp_path, monkeypatch):
    path = tmp_path / "v3.sqlite"
    _write_version_3_store(path, monkeypatch, [make_run(seed=0), make_run(seed=1)])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE runs SET environment = '{not json', load = '[1]' WHERE id = 2")
    conn.commit()
    conn.close()
    assert Store(path).count() == 2
    assert _columns(path, "config", "other_cpu_share") == [
        (make_run(seed=0).configuration.key, 0.0),
        (None, None),
    ]


def test_a_failing_migration_step_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "v3.sqlite"
    _write_version_3_store(path, monkeypatch, [make_run()])

    def broken(conn):
        conn.execute("UPDATE runs SET name = 'changed'")
        raise KeyError("a fault\nof the step")

    number, description, steps = store_mod.MIGRATIONS[3]
    monkeypatch.setattr(
        store_mod,
        "MIGRATIONS",
        [*store_mod.MIGRATIONS[:3], (number, description, (*steps, broken))],
    )
    with pytest.raises(StoreError, match="to schema version 4 failed: KeyError") as info:
        Store(path).count()
    assert "\n" not in str(info.value)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert "config" not in [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    assert conn.execute("SELECT name FROM runs").fetchall() == [("smoke",)]
    conn.close()


def test_a_run_is_written_with_its_configuration_and_the_other_processes_share(store):
    entry = make_run(load=0.3)
    stored_id = store.add(entry)
    assert _columns(store.path, "config", "other_cpu_share") == [(entry.configuration.key, 0.3)]
    row = store.rows()[0]
    assert (row.id, row.config, row.other_cpu_share) == (stored_id, entry.configuration.key, 0.3)
    for odd in (None, float("nan"), "busy", True):
        entry.load = {"other_cpu_share": odd}
        store.add(entry)
    assert [share for _, share in _columns(store.path, "config", "other_cpu_share")][1:] == [
        None
    ] * 4


def test_the_steal_time_has_its_own_column(store):
    entry = make_run()
    entry.load = {"other_cpu_share": 0.05, "steal_share": 0.12}
    stored_id = store.add(entry)
    conn = sqlite3.connect(store.path)
    column = conn.execute("SELECT steal_share FROM runs WHERE id = ?", (stored_id,)).fetchone()
    conn.close()
    assert column == (pytest.approx(0.12),)
    assert store.get(stored_id).load == {"other_cpu_share": 0.05, "steal_share": 0.12}
    assert store.rows()[0].steal_share == pytest.approx(0.12)
    unmeasured = make_run()
    unmeasured.load = {"other_cpu_share": 0.05, "steal_share": None}  # no steal time here
    back = store.get(store.add(unmeasured))
    assert back.load == {"other_cpu_share": 0.05, "steal_share": None}


def test_a_store_of_a_newer_version_is_refused_in_one_line(tmp_path):
    path = tmp_path / "new.sqlite"
    Store(path).add(make_run())
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="written by a newer traceml_nb") as info:
        Store(path).add(make_run())
    assert "\n" not in str(info.value)


# --- round trip -------------------------------------------------------------------------------
def test_a_run_comes_back_as_it_was_stored(store):
    entry = make_run("resnet", steps=80, source="for x, y in loader:\n    step(x, y)\n")
    entry.cost = {"idle_gpu_s": 12.0, "cost_usd": 0.01}
    stored_id = store.add(entry, session="s1")
    back = store.get(stored_id)
    assert back.stored_id == stored_id and back.label == f"@{stored_id} resnet"
    assert back.origin == "store" and back.session_id == "s1"
    assert (back.name, back.named, back.status, back.source) == (
        "resnet",
        True,
        "completed",
        entry.source,
    )
    assert back.summary == entry.summary
    assert back.diagnosis == entry.diagnosis
    assert back.loaders == entry.loaders
    assert back.environment == entry.environment
    assert back.load == {"other_cpu_share": 0.0}
    assert back.cost == entry.cost
    assert back.step_ms == pytest.approx(entry.step_ms, rel=1e-6)  # float32
    row = store.rows()[0]
    assert (row.id, row.name, row.hardware) == (stored_id, "resnet", hardware_class(ENV))
    assert row.idle_gpu_s == 12.0


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


def test_a_million_step_run_is_written_at_once(store, run_store):
    """The steps are downsampled before the store sees them; the write is one INSERT. The
    exact time is in benchmarks/README.md; here only a bound a busy machine keeps."""
    from traceml_nb.session.history import downsample

    entry = make_run(steps=200)
    entry.step_ms = downsample(list(range(1_000_000)))
    store.add(entry)  # the first write creates the schema
    started = time.perf_counter()
    store.add(entry)
    assert time.perf_counter() - started < 1.0
    assert len(store.get(2).step_ms) == MAX_STORED_STEPS


def test_baseline_lookup_takes_the_last_completed_runs_on_the_same_hardware(store):
    other_hw = dict(ENV, cpu_model="Other CPU")
    for i in range(8):
        store.add(make_run("smoke", seed=i))
    store.add(make_run("smoke", status="interrupted"))
    store.add(make_run("smoke", env=other_hw))
    store.add(make_run("other"))
    hw = hardware_class(ENV)
    ids = [r.stored_id for r in store.baseline("smoke", hardware=hw, k=5)]
    assert ids == [4, 5, 6, 7, 8]
    assert [r.stored_id for r in store.baseline("smoke", hardware=hw, before=4, k=5)] == [1, 2, 3]
    assert [r.stored_id for r in store.baseline("smoke", hardware=None, k=2)] == [8, 10]
    assert store.latest("smoke").stored_id == 10
    assert store.latest("smoke", hardware=hw).stored_id == 9
    assert store.names() == ["other", "smoke"]


def test_a_pinned_baseline_replaces_the_last_runs(store):
    for i in range(6):
        store.add(make_run("smoke", seed=i))
    store.add(make_run("other"))
    store.pin("smoke", [2, 3])
    assert store.pins("smoke") == [2, 3]
    assert [r.stored_id for r in store.baseline("smoke", hardware=None)] == [2, 3]
    with pytest.raises(StoreError, match="is 'other', not 'smoke'"):
        store.pin("smoke", [7])
    with pytest.raises(StoreError, match="no stored run @99"):
        store.pin("smoke", [99])
    assert store.pins("smoke") == [2, 3]  # a refused pin changes nothing
    assert store.unpin("smoke") == 2
    assert [r.stored_id for r in store.baseline("smoke", hardware=None, k=5)] == [2, 3, 4, 5, 6]


def test_the_baseline_of_one_configuration(store):
    for i in range(4):
        store.add(make_run("smoke", seed=i))  # @1-@4
    for i in range(3):
        store.add(make_run("smoke", seed=10 + i, num_workers=4))  # @5-@7: the fixed loader
    store.add(make_run("smoke", seed=20))  # @8: the first configuration again
    store.add(make_run("smoke", seed=21, env=dict(ENV, cpu_model="Other CPU")))  # @9
    starved, fixed = make_run("smoke").configuration.key, make_run(num_workers=4).configuration.key
    hw = hardware_class(ENV)
    assert starved != fixed
    ids = [r.stored_id for r in store.baseline("smoke", hardware=hw, config=starved, k=3)]
    assert ids == [3, 4, 8]
    ids = [r.stored_id for r in store.baseline("smoke", hardware=hw, config=fixed, k=5)]
    assert ids == [5, 6, 7]
    assert [r.stored_id for r in store.baseline("smoke", hardware=hw, config=fixed, before=6)] == [
        5
    ]
    assert [r.stored_id for r in store.baseline("smoke", hardware=None, k=3)] == [7, 8, 9]
    assert store.baseline("smoke", hardware=hw, config="0" * 16) == []
    assert store.baseline("other", hardware=hw, config=starved) == []  # the name is part of it
    store.pin("smoke", [5, 6])  # a pinned baseline stays pinned, whatever its configuration
    assert [r.stored_id for r in store.baseline("smoke", hardware=hw, config=starved)] == [5, 6]


def test_the_class_rows_are_every_names_completed_runs_on_one_class(store):
    other_hw = dict(ENV, cpu_model="Other CPU")
    store.add(make_run("smoke", seed=0, step_ms=10.0))  # @1
    store.add(make_run("resnet", seed=1, step_ms=40.0, load=0.4))  # @2
    store.add(make_run("smoke", seed=2, env=other_hw))  # @3: another class
    store.add(make_run("smoke", seed=3, status="interrupted"))  # @4: not completed
    store.add(make_run("bert", seed=4, steps=0))  # @5: no step, no median
    store.add(make_run("bert", seed=5, step_ms=80.0))  # @6
    rows = store.class_rows(hardware_class(ENV))
    assert [(r.id, r.name) for r in rows] == [(1, "smoke"), (2, "resnet"), (6, "bert")]
    assert rows[0].step_ms_median == pytest.approx(10.0, rel=0.05)
    assert rows[1].other_cpu_share == 0.4 and rows[1].config == make_run("resnet").configuration.key
    assert [r.id for r in store.class_rows(hardware_class(ENV), before=6)] == [1, 2]
    assert [r.id for r in store.class_rows(hardware_class(other_hw))] == [3]
    assert store.class_rows("GPU: Tesla T4") == []


# --- many writers -----------------------------------------------------------------------------
WRITER = """
import sys
sys.path.insert(0, "tests/support")
from store_helpers import make_run
from traceml_nb.session.store import Store
store = Store(sys.argv[1])
entry = make_run("writer-" + sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
for i in range(100):
    store.add(entry, session=sys.argv[2])
print("done")
"""


def test_two_processes_writing_100_runs_each_at_once_lose_none(tmp_path):
    import sys

    path = tmp_path / "shared.sqlite"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(store_mod.__file__).rsplit("/traceml_nb/", 1)[0],
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:  # both start writing at the same moment (a fresh file: both migrate)
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    store = Store(path)
    assert store.count() == 200
    assert len(store.rows(name="writer-a")) == 100 and len(store.rows(name="writer-b")) == 100
    assert [r.id for r in store.rows()] == list(range(1, 201))


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
