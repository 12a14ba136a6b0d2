"""The run store's behaviour, one suite for both backends: a test module subclasses
:class:`StoreSuite` and gives it a ``db`` fixture, a :class:`StoreDb` of an empty store of its
backend (tests/unit/test_store.py: a SQLite file; tests/integration/test_store_postgres.py: a
database of a real PostgreSQL server). Schema and migrations, round trips, baselines, pins,
many writers at once, and a two-node ``torchrun`` job whose nodes store their ranks apart."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest
from store_helpers import ENV, REPO, make_run

from traceml_nb.analysis.configuration import configuration_of
from traceml_nb.analysis.thresholds import MAX_STORED_STEPS
from traceml_nb.session import store as store_mod
from traceml_nb.session.environment import hardware_class
from traceml_nb.session.store import SCHEMA_VERSION, Store, StoreError

SCHEMA = [
    (1, "runs and pinned baselines"),
    (2, "steal time of each run"),
    (3, "ranks of a job"),
    (4, "configuration of each run"),
]
#: the columns added after schema 1
LATER_COLUMNS = ("steal_share", "rank", "world_size", "job_id", "config", "other_cpu_share")


class StoreDb:
    """An empty store of one backend (``kind``: "sqlite" or "postgresql") at ``target`` (a
    path or a URL), and raw SQL on it: what the store's own methods do not show."""

    def __init__(self, kind: str, target: str) -> None:
        self.kind = kind
        self.target = target

    def store(self, **options) -> Store:
        return Store(self.target, **options)

    def sql(self, statement: str, args: tuple = ()) -> list[tuple]:
        """Rows of ``statement`` (SQLite's dialect, ``?`` placeholders), committed."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.target)
            try:
                rows = conn.execute(statement, args).fetchall()
                conn.commit()
                return rows
            finally:
                conn.close()
        import psycopg

        from traceml_nb.session.store_postgres import dialect

        with psycopg.connect(self.target, autocommit=True) as conn:
            cursor = conn.execute(dialect(statement), args or None)
            return cursor.fetchall() if cursor.description else []

    def columns(self) -> list[str]:
        """The columns of ``runs``, in order."""
        if self.kind == "sqlite":
            return [r[1] for r in self.sql("PRAGMA table_info(runs)")]
        return [
            r[0]
            for r in self.sql(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' "
                "ORDER BY ordinal_position"
            )
        ]

    def index_columns(self, index: str) -> list[str]:
        if self.kind == "sqlite":
            return [r[2] for r in self.sql(f"PRAGMA index_info({index})")]
        return [
            r[0]
            for r in self.sql(
                "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE c.relname = ? ORDER BY array_position(i.indkey::int2[], a.attnum)",
                (index,),
            )
        ]

    def version(self) -> int:
        if self.kind == "sqlite":
            return self.sql("PRAGMA user_version")[0][0]
        return self.sql("SELECT MAX(version) FROM schema_migrations")[0][0]

    def set_version(self, number: int) -> None:
        """Mark the store as of schema ``number`` (a newer traceml_nb's)."""
        if self.kind == "sqlite":
            self.sql(f"PRAGMA user_version = {number}")
        else:
            self.sql("INSERT INTO schema_migrations VALUES (?, 'a newer one', 0)", (number,))


def write_old_store(db: StoreDb, monkeypatch, version: int, entries, session: str) -> None:
    """A store as traceml_nb wrote it at schema ``version``: its migrations and its columns."""
    dropped = {1: LATER_COLUMNS, 3: ("config", "other_cpu_share")}[version]
    with monkeypatch.context() as m:
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:version])
        m.setattr(store_mod, "SCHEMA_VERSION", version)
        m.setattr(
            store_mod, "RUN_COLUMNS", tuple(c for c in store_mod.RUN_COLUMNS if c not in dropped)
        )
        db.store().add_many(entries, session=session)
        if version == 1:
            db.store().pin("smoke", [1, 2])
    assert db.version() == version
    assert not set(dropped) & set(db.columns())


def version_3_runs() -> list:
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
    return [named, again, edited, workers, other_hw, newer_torch, script, git, unknown, unnamed] + [
        crashed
    ]


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

#: One node of a two-node ``torchrun`` job: for each ``[job_id, medians]`` given, it stores its
#: ranks' runs (rank ``node * len(medians) + k`` with ``medians[k]``, of ``2 * len(medians)``).
NODE = """
import json, sys
sys.path.insert(0, "tests/support")
from store_helpers import ENV, make_run
from traceml_nb.session.store import Store
store, node = Store(sys.argv[1]), int(sys.argv[2])
jobs = json.loads(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
for job, medians in jobs:
    for k, step_ms in enumerate(medians):
        rank = node * len(medians) + k
        entry = make_run("multinode", step_ms=step_ms, seed=rank, env=dict(ENV, host_hash=f"node{node}"))
        entry.rank, entry.world_size, entry.job_id = rank, 2 * len(medians), job
        store.add(entry, session=f"node{node}")
"""


def nodes(db, jobs_of_node: dict[int, list]) -> None:
    """The nodes of ``jobs_of_node`` (node -> ``[[job_id, medians], ...]``) storing their
    ranks at the same moment, each a process of its own."""
    procs = {
        node: subprocess.Popen(
            [sys.executable, "-c", NODE, db.target, str(node), json.dumps(jobs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
        )
        for node, jobs in jobs_of_node.items()
    }
    for proc in procs.values():
        assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)[1]
    for proc in procs.values():
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs.values():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err


class StoreSuite:
    """The tests every backend passes (module docstring)."""

    @pytest.fixture
    def store(self, db):
        return db.store()

    # --- schema -------------------------------------------------------------------------------
    def test_a_new_store_has_the_schema_and_its_migrations(self, db, store):
        store.add(make_run())
        assert db.version() == SCHEMA_VERSION
        assert store.schema() == SCHEMA

    def test_a_store_of_an_older_version_is_migrated(self, db, monkeypatch):
        extra = (5, "a test column", ("ALTER TABLE runs ADD COLUMN test_extra TEXT",))
        db.store().add(make_run())  # the current version
        monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, extra])
        monkeypatch.setattr(store_mod, "SCHEMA_VERSION", 5)
        db.store().add(make_run())
        assert db.store().schema() == [*SCHEMA, (5, "a test column")]
        assert db.store().count() == 2 and db.version() == 5
        assert "test_extra" in db.columns()

    @pytest.mark.parametrize("first_use", ["write", "read"])
    def test_a_version_1_store_migrates_to_steal_time_and_loses_nothing(
        self, db, monkeypatch, first_use
    ):
        entries = [make_run(seed=i, step_ms=20.0 + i, load=0.1 * i) for i in range(3)]
        entries[2].cost = {"idle_gpu_s": 3.0, "cost_usd": 0.002}
        write_old_store(db, monkeypatch, 1, entries, "old")
        store = db.store()
        if first_use == "write":  # a run of the new version: stored with its steal time
            newer = make_run(seed=9)
            newer.load["steal_share"] = 0.12
            assert store.add(newer) == 4
        else:  # `check` or `history --all` may be the first to open it after an upgrade
            assert store.count() == 3
        assert store.schema() == SCHEMA
        assert db.version() == SCHEMA_VERSION == 4
        steal = db.sql("SELECT steal_share FROM runs ORDER BY id")
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

    @pytest.mark.parametrize("first_use", ["write", "read"])
    def test_a_version_3_store_gets_the_configuration_of_every_run(
        self, db, monkeypatch, first_use
    ):
        entries = version_3_runs()
        write_old_store(db, monkeypatch, 3, entries, "v3")
        store = db.store()
        if first_use == "write":  # a new run of the first run's configuration
            newer = make_run("smoke", seed=11, load=0.5)
            assert store.add(newer) == len(entries) + 1
        else:  # `check` or `history --all` may be the first to open it after an upgrade
            assert store.count() == len(entries)
        assert store.schema()[-1] == (4, "configuration of each run") and SCHEMA_VERSION == 4
        stored = db.sql("SELECT config, other_cpu_share FROM runs ORDER BY id")
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
        assert db.index_columns("runs_by_config") == ["name", "hardware", "config", "id"]

    def test_a_stored_run_the_migration_cannot_read_gets_no_configuration(self, db, monkeypatch):
        write_old_store(db, monkeypatch, 3, [make_run(seed=0), make_run(seed=1)], "v3")
        db.sql("UPDATE runs SET environment = '{not json', load = '[1]' WHERE id = 2")
        assert db.store().count() == 2
        assert db.sql("SELECT config, other_cpu_share FROM runs ORDER BY id") == [
            (make_run(seed=0).configuration.key, 0.0),
            (None, None),
        ]

    def test_a_failing_migration_step_leaves_the_store_as_it_was(self, db, monkeypatch):
        write_old_store(db, monkeypatch, 3, [make_run()], "v3")

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
            db.store().count()
        assert "\n" not in str(info.value)
        assert db.version() == 3 and "config" not in db.columns()
        assert db.sql("SELECT name FROM runs") == [("smoke",)]

    def test_a_store_of_a_newer_version_is_refused_in_one_line(self, db):
        db.store().add(make_run())
        db.set_version(SCHEMA_VERSION + 1)
        with pytest.raises(StoreError, match="written by a newer traceml_nb") as info:
            db.store().add(make_run())
        assert "\n" not in str(info.value)

    # --- round trip ---------------------------------------------------------------------------
    def test_a_run_is_written_with_its_configuration_and_the_other_processes_share(self, db, store):
        entry = make_run(load=0.3)
        stored_id = store.add(entry)
        query = "SELECT config, other_cpu_share FROM runs ORDER BY id"
        assert db.sql(query) == [(entry.configuration.key, 0.3)]
        row = store.rows()[0]
        assert (row.id, row.config, row.other_cpu_share) == (
            stored_id,
            entry.configuration.key,
            0.3,
        )
        for odd in (None, float("nan"), "busy", True):
            entry.load = {"other_cpu_share": odd}
            store.add(entry)
        assert [share for _, share in db.sql(query)][1:] == [None] * 4

    def test_the_steal_time_has_its_own_column(self, db, store):
        entry = make_run()
        entry.load = {"other_cpu_share": 0.05, "steal_share": 0.12}
        stored_id = store.add(entry)
        column = db.sql("SELECT steal_share FROM runs WHERE id = ?", (stored_id,))
        assert column == [(pytest.approx(0.12),)]
        assert store.get(stored_id).load == {"other_cpu_share": 0.05, "steal_share": 0.12}
        assert store.rows()[0].steal_share == pytest.approx(0.12)
        unmeasured = make_run()
        unmeasured.load = {"other_cpu_share": 0.05, "steal_share": None}  # no steal time here
        back = store.get(store.add(unmeasured))
        assert back.load == {"other_cpu_share": 0.05, "steal_share": None}

    def test_a_run_comes_back_as_it_was_stored(self, store):
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
        assert back.started_at == entry.started_at and back.elapsed_s == entry.elapsed_s
        assert back.step_ms == pytest.approx(entry.step_ms, rel=1e-6)  # float32
        row = store.rows()[0]
        assert (row.id, row.name, row.hardware) == (stored_id, "resnet", hardware_class(ENV))
        assert row.idle_gpu_s == 12.0
        assert store.entries([]) == [] and store.get(stored_id).named is True
        with pytest.raises(StoreError, match="no stored run @99"):
            store.get(99)

    def test_a_million_step_run_is_written_at_once(self, store):
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

    def test_names_counts_totals_and_the_runs_of_a_job(self, store):
        store.add(make_run("smoke", seed=0))
        gpu = make_run("resnet", seed=1)
        gpu.cost = {"idle_gpu_s": 30.0, "cost_usd": 0.5}
        store.add(gpu)
        for rank in (1, 0):
            ranked = make_run("ddp", seed=2 + rank)
            ranked.rank, ranked.world_size, ranked.job_id = rank, 2, "job-1"
            store.add(ranked)
        assert store.names() == ["ddp", "resnet", "smoke"]
        assert (store.count(), store.count("ddp"), store.count("none")) == (4, 2, 0)
        totals = {t.name: t for t in store.totals(since=0.0)}
        assert (totals["resnet"].runs, totals["resnet"].idle_gpu_s) == (1, 30.0)
        assert (totals["resnet"].idle_cost_usd, totals["resnet"].priced_runs) == (0.5, 1)
        assert store.totals(since=2e9) == []
        assert [(r.rank, r.stored_id) for r in store.job_runs("job-1")] == [(0, 4), (1, 3)]
        assert [r.id for r in store.job_rows("ddp")] == [3, 4]
        assert [r.id for r in store.rows(limit=2)] == [3, 4]

    def test_baseline_lookup_takes_the_last_completed_runs_on_the_same_hardware(self, store):
        other_hw = dict(ENV, cpu_model="Other CPU")
        for i in range(8):
            store.add(make_run("smoke", seed=i))
        store.add(make_run("smoke", status="interrupted"))
        store.add(make_run("smoke", env=other_hw))
        store.add(make_run("other"))
        hw = hardware_class(ENV)
        ids = [r.stored_id for r in store.baseline("smoke", hardware=hw, k=5)]
        assert ids == [4, 5, 6, 7, 8]
        before = store.baseline("smoke", hardware=hw, before=4, k=5)
        assert [r.stored_id for r in before] == [1, 2, 3]
        assert [r.stored_id for r in store.baseline("smoke", hardware=None, k=2)] == [8, 10]
        assert store.latest("smoke").stored_id == 10
        assert store.latest("smoke", hardware=hw).stored_id == 9
        assert store.names() == ["other", "smoke"]

    def test_a_rank_is_compared_with_the_same_rank_of_other_jobs(self, store):
        for job in ("j1", "j2"):
            for rank in (0, 1):
                ranked = make_run("ddp", seed=rank)
                ranked.rank, ranked.world_size, ranked.job_id = rank, 2, job
                store.add(ranked)  # @1-@4
        store.add(make_run("ddp", seed=9))  # @5: alone
        found = store.baseline("ddp", hardware=None, rank_of=(1, 2, "j2"))
        assert [r.stored_id for r in found] == [2]
        assert [r.stored_id for r in store.baseline("ddp", hardware=None, alone=True)] == [5]

    def test_a_pinned_baseline_replaces_the_last_runs(self, store):
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
        last = store.baseline("smoke", hardware=None, k=5)
        assert [r.stored_id for r in last] == [2, 3, 4, 5, 6]

    def test_the_baseline_of_one_configuration(self, store):
        for i in range(4):
            store.add(make_run("smoke", seed=i))  # @1-@4
        for i in range(3):
            store.add(make_run("smoke", seed=10 + i, num_workers=4))  # @5-@7: the fixed loader
        store.add(make_run("smoke", seed=20))  # @8: the first configuration again
        store.add(make_run("smoke", seed=21, env=dict(ENV, cpu_model="Other CPU")))  # @9
        starved = make_run("smoke").configuration.key
        fixed = make_run(num_workers=4).configuration.key
        hw = hardware_class(ENV)
        assert starved != fixed

        def ids(**kw):
            return [r.stored_id for r in store.baseline("smoke", **kw)]

        assert ids(hardware=hw, config=starved, k=3) == [3, 4, 8]
        assert ids(hardware=hw, config=fixed, k=5) == [5, 6, 7]
        assert ids(hardware=hw, config=fixed, before=6) == [5]
        assert ids(hardware=None, k=3) == [7, 8, 9]
        assert store.baseline("smoke", hardware=hw, config="0" * 16) == []
        assert store.baseline("other", hardware=hw, config=starved) == []  # the name is part
        store.pin("smoke", [5, 6])  # a pinned baseline stays pinned, whatever its configuration
        assert ids(hardware=hw, config=starved) == [5, 6]

    def test_the_class_rows_are_every_names_completed_runs_on_one_class(self, store):
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
        assert rows[1].other_cpu_share == 0.4
        assert rows[1].config == make_run("resnet").configuration.key
        assert [r.id for r in store.class_rows(hardware_class(ENV), before=6)] == [1, 2]
        assert [r.id for r in store.class_rows(hardware_class(other_hw))] == [3]
        assert store.class_rows("GPU: Tesla T4") == []

    # --- many writers -------------------------------------------------------------------------
    def test_two_processes_writing_100_runs_each_at_once_lose_none(self, db):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, db.target, name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=str(REPO),
            )
            for name in ("a", "b")
        ]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:  # both start writing at the same moment (a new store: both migrate)
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
        store = db.store()
        assert store.count() == 200
        assert len(store.rows(name="writer-a")) == 100 and len(store.rows(name="writer-b")) == 100
        assert sorted(r.id for r in store.rows()) == list(range(1, 201))
        assert store.schema() == SCHEMA  # migrated once

    def test_a_two_node_job_is_judged_whole_once_its_last_node_stored_its_ranks(self, db):
        """Two nodes of a 4-rank ``torchrun`` job store their ranks apart, at once, three jobs
        running; then a fourth job, node 0's ranks first and node 1's late, rank 3 the
        slowest."""
        from traceml_nb.session.check import check
        from traceml_nb.views.check_words import check_paragraph

        base = {0: [20.0, 20.2], 1: [20.1, 20.8]}  # rank 3 the slowest of each, by 3%
        jobs = {n: [[f"job-{k}", medians] for k in range(3)] for n, medians in base.items()}
        new = "job-new-0123456789"
        nodes(db, jobs)
        nodes(db, {0: [[new, [20.1, 20.3]]]})  # node 0's ranks of a fourth job; node 1's late
        early = check("multinode", store=db.target)
        assert early.exit_code == 2, check_paragraph(early)
        assert "the job is partial: ranks 2, 3 stored no run" in check_paragraph(early)
        assert "(2 of 4 ranks, " in check_paragraph(early)

        nodes(db, {1: [[new, [20.2, 32.0]]]})
        whole = check("multinode", store=db.target)
        said = check_paragraph(whole)
        assert whole.exit_code == 1 and whole.status == "regression", said
        assert said.startswith("REGRESSION: 'multinode' job job-new-\u2026 (4 ranks, @"), said
        assert "; slowest rank 3) is slower than its baseline, 3 jobs " in said
        assert whole.candidate is not None and whole.candidate.rank == 3
        assert whole.to_dict()["job"]["ids"] == [r.id for r in db.store().job_runs(new)]
        assert [j["slowest_rank"] for j in whole.to_dict()["baseline_jobs"]] == [3, 3, 3]
