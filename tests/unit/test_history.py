"""The session history: numbering, lookup, pairing of reruns, bounded size, JSON persistence."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
from builders import RecordBuilder, cpu_capabilities

from traceml_nb.analysis import analyze
from traceml_nb.analysis.thresholds import MAX_STORED_STEPS
from traceml_nb.api import default_session
from traceml_nb.session import history_file as history_file_mod
from traceml_nb.session.history import (
    MAX_RUNS,
    SIMILAR_SOURCE_RATIO,
    History,
    RunEntry,
    downsample,
    entry_from,
    source_similarity,
)
from traceml_nb.session.history_file import HistoryFileError
from traceml_nb.views.history_table import history_table
from traceml_nb.views.history_table import history_text as render_history_text

CELL = """\
loader = DataLoader(train_ds, batch_size=64, shuffle=True, num_workers=0)
model.train()
for x, y in loader:
    x, y = x.to(device), y.to(device)
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
"""
CELL_TUNED = CELL.replace(
    "num_workers=0)",
    "num_workers=2, pin_memory=True, persistent_workers=True, prefetch_factor=4)",
)
SMALL_CELL = "for x, y in DataLoader(ds, batch_size=8):\n    step(x, y)\n"
SMALL_CELL_TUNED = (
    "for x, y in DataLoader(ds, batch_size=8, num_workers=2, pin_memory=True,\n"
    "                       persistent_workers=True, prefetch_factor=4):\n    step(x, y)\n"
)
EVAL_CELL = """\
model.eval()
correct = 0
with torch.no_grad():
    for x, y in DataLoader(val_ds, batch_size=256):
        correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
print(correct / len(val_ds))
"""


def make_entry(
    name: str = "run",
    *,
    step_ms: float = 20.0,
    steps: int = 40,
    wait_ms: float = 5.0,
    cell_id: str | None = None,
    source: str | None = None,
    named: bool | None = None,
    status: str = "completed",
) -> RunEntry:
    b = RecordBuilder()
    b.loader(num_workers=0, batch_size=8)
    b.steps(steps, step_ms, wait_ms)
    record = b.finish()
    analysis = analyze(record, cpu_capabilities(), cpus_available=2)
    run = SimpleNamespace(
        name=name,
        status=status,
        error=None if status == "completed" else "KeyboardInterrupt",
        started_at=1_700_000_000.0,
        elapsed_s=record.elapsed_ns / 1e9,
        record=record,
        cell_id=cell_id,
        source=source,
    )
    if named is not None:
        run.named = named
    return entry_from(run, analysis)


# --- entries ------------------------------------------------------------------------------------
def test_entry_from_a_run():
    e = make_entry("baseline", steps=30, cell_id="cell-1", source=CELL)
    assert e.id == 0
    assert (e.name, e.named, e.cell_id, e.source, e.status) == (
        "baseline",
        True,
        "cell-1",
        CELL,
        "completed",
    )
    assert e.started_at == 1_700_000_000.0
    assert e.elapsed_s == pytest.approx(0.6)
    assert e.step_ms == [20.0] * 29  # the first step is warm-up
    assert e.loaders[0]["num_workers"] == 0
    assert e.summary.steady_steps == 29
    assert e.diagnosis.verdict == "input-bound"
    assert make_entry("run").named is False  # the default name identifies nothing
    assert make_entry("run", named=True).named is True


def test_entry_from_reads_cell_id_and_source_from_the_run():
    b = RecordBuilder()
    b.loader()
    b.steps(20, 10.0)
    record = b.finish()
    run = SimpleNamespace(
        name="run", status="failed", error="ValueError: x", started_at=5.0, elapsed_s=0.2,
        record=record, cell_id="abc", source="x = 1",
    )  # fmt: skip
    e = entry_from(run, analyze(record, cpu_capabilities(), cpus_available=2))
    assert (e.cell_id, e.source, e.status, e.error) == ("abc", "x = 1", "failed", "ValueError: x")


def test_a_running_run_cannot_join_the_history():
    with pytest.raises(ValueError, match="only an ended run"):
        make_entry(status="running")


def test_step_times_are_downsampled_evenly():
    values = list(range(10_000))
    kept = downsample(values)
    assert len(kept) == MAX_STORED_STEPS
    assert kept[0] == 0 and kept[-1] == 9_999
    gaps = {b - a for a, b in zip(kept, kept[1:], strict=False)}
    assert gaps <= {2, 3}
    assert downsample([1.0, 2.0]) == [1.0, 2.0]
    e = make_entry(steps=MAX_STORED_STEPS + 500)
    assert len(e.step_ms) == MAX_STORED_STEPS


# --- numbering and lookup --------------------------------------------------------------------------
def test_ids_and_lookup():
    h = History()
    a = h.add(make_entry("baseline"))
    b = h.add(make_entry("run"))
    c = h.add(make_entry("baseline"))
    assert [e.id for e in h.entries] == [1, 2, 3]
    assert h.get(2) is b
    assert h.get("2") is b
    assert h.get("#2") is b
    assert h.get(" #1 ") is a
    assert h.get("baseline") is c  # the latest with that name
    with pytest.raises(KeyError) as info:
        h.get("#9")
    assert (
        info.value.args[0]
        == "no run '#9' in this session's history; it has #1 baseline, #2 run, #3 baseline"
    )
    with pytest.raises(KeyError, match="no run 'nope'"):
        h.get("nope")
    with pytest.raises(KeyError) as info:
        History().get(1)
    assert info.value.args[0] == "no run 1: the history of this session is empty"


def test_the_history_is_bounded():
    assert MAX_RUNS == 500
    h = History(max_runs=3)
    for i in range(5):
        h.add(make_entry(f"r{i}", steps=12))
    assert [e.id for e in h.entries] == [3, 4, 5]
    assert h.dropped == 2
    with pytest.raises(KeyError):
        h.get(1)
    assert render_history_text(h).endswith("(2 older runs dropped: the history keeps the last 3)")


def test_clear_restarts_numbering():
    h = History()
    h.add(make_entry())
    h.clear()
    assert h.entries == []
    assert h.add(make_entry()).id == 1


def test_session_history_is_one_per_process():
    assert default_session().history is default_session().history
    assert isinstance(default_session().history, History)


# --- pairing reruns of a cell ------------------------------------------------------------------------
def test_pairing_by_name():
    h = History()
    base = h.add(make_entry("baseline", step_ms=30.0, cell_id="c1"))
    h.add(make_entry("other", cell_id="c1"))  # same cell, another name
    again = h.add(make_entry("baseline", step_ms=25.0, cell_id="c2"))
    assert h.previous_of(again) is base
    assert h.same_cell(again) == [base]


def test_the_best_run_is_the_fastest_per_sample_where_every_batch_size_is_known():
    h = History()
    small = h.add(make_entry(step_ms=10.0, cell_id="c1", source=CELL))  # 8 a batch: 1.25 ms each
    large = h.add(make_entry(step_ms=16.0, cell_id="c1", source=CELL_TUNED))
    large.summary = replace(large.summary, batch_size=16)  # 1 ms a sample: the best
    again = h.add(make_entry(step_ms=15.0, cell_id="c1", source=CELL_TUNED))
    assert h.best_of(again) is large
    large.summary = replace(large.summary, batch_size=None)  # not known: the shortest step
    assert h.best_of(again) is small


def test_a_new_name_falls_back_to_the_cell_id():
    h = History()
    base = h.add(make_entry("baseline", cell_id="c1", source=CELL))
    tuned = h.add(make_entry("workers2", cell_id="c1", source=CELL_TUNED))
    assert h.previous_of(tuned) is base


def test_pairing_by_cell_id():
    h = History()
    first = h.add(make_entry(step_ms=30.0, cell_id="c1", source=CELL))
    h.add(make_entry(step_ms=10.0, cell_id="c2", source=CELL))  # another cell, same text
    second = h.add(make_entry(step_ms=20.0, cell_id="c1", source=CELL_TUNED))
    third = h.add(make_entry(step_ms=25.0, cell_id="c1", source=CELL_TUNED))
    assert h.previous_of(third) is second
    assert h.best_of(third) is second
    assert h.same_cell(third) == [first, second]
    assert h.previous_of(first) is None


def test_pairing_by_similar_source_after_editing_the_dataloader_arguments():
    assert source_similarity(CELL, CELL_TUNED) >= SIMILAR_SOURCE_RATIO
    assert source_similarity(SMALL_CELL, SMALL_CELL_TUNED) >= SIMILAR_SOURCE_RATIO
    assert source_similarity(CELL, EVAL_CELL) < SIMILAR_SOURCE_RATIO
    h = History()
    train = h.add(make_entry(step_ms=30.0, source=CELL))
    h.add(make_entry(source=EVAL_CELL))
    small = h.add(make_entry(source=SMALL_CELL))
    tuned = h.add(make_entry(step_ms=18.0, source=CELL_TUNED))
    assert h.previous_of(tuned) is train
    small_tuned = h.add(make_entry(source=SMALL_CELL_TUNED))
    assert h.previous_of(small_tuned) is small
    # an edit of the edit still reaches the first version through the chain
    tuned_again = h.add(
        make_entry(step_ms=40.0, source=CELL_TUNED.replace("batch_size=64", "batch_size=128"))
    )
    assert h.previous_of(tuned_again) is tuned
    assert h.same_cell(tuned_again) == [train, tuned]
    assert h.best_of(tuned_again) is tuned


def test_unrelated_cells_do_not_pair():
    h = History()
    h.add(make_entry(source=CELL))
    ev = h.add(make_entry(source=EVAL_CELL))
    assert h.previous_of(ev) is None
    assert h.best_of(ev) is None
    assert h.previous_of(h.add(make_entry(source=None))) is None


def test_pairing_an_entry_not_yet_added():
    h = History()
    first = h.add(make_entry(cell_id="c1"))
    pending = make_entry(cell_id="c1")
    assert h.previous_of(pending) is first


def test_runs_without_steady_steps_are_skipped_for_comparison():
    h = History()
    good = h.add(make_entry(cell_id="c1"))
    h.add(make_entry(cell_id="c1", steps=1))  # failed at once: nothing to compare
    latest = h.add(make_entry(cell_id="c1"))
    assert h.previous_of(latest) is good


# --- the table ---------------------------------------------------------------------------------------
def test_history_table_and_text():
    h = History()
    h.add(make_entry("baseline", step_ms=20.0, wait_ms=12.0, cell_id="c1"))
    h.add(make_entry("tuned", step_ms=10.0, wait_ms=0.2, cell_id="c1", status="interrupted"))
    rows = history_table(h)
    assert [r["label"] for r in rows] == ["#1 baseline", "#2 tuned"]
    first, second = rows
    assert first["previous_id"] is None and first["step_change"] is None
    assert second["previous_id"] == 1
    assert second["step_change"] == pytest.approx(-0.5)
    assert first["verdict"] == "input-bound"
    assert first["cause"] == "too few DataLoader workers"
    assert second["verdict"] == "compute-bound"
    assert set(first) >= {
        "id",
        "status",
        "started",
        "elapsed_s",
        "steady_steps",
        "step_ms_median",
        "samples_per_s",
    }
    text = render_history_text(h).splitlines()
    assert text[0].split() == [
        "run",
        "status",
        "started",
        "time",
        "steps",
        "step",
        "throughput",
        "data",
        "wait",
        "GPU",
        "util",
        "verdict",
        "vs",
    ]
    assert text[1].split()[:2] == ["#1", "baseline"]
    assert "input-bound" in text[1]
    assert text[2].rstrip().endswith("compute-bound  \u221250% vs #1")
    assert "interrupted" in text[2]
    assert "\u2014" in text[1]  # GPU utilisation: unavailable on CPU, shown as a dash, never 0
    assert render_history_text(History()) == "No traceml_nb runs in this session yet."


def test_the_table_compares_with_the_previous_run_per_sample_where_the_batch_size_changed():
    """Twice the batch in a step 60% longer: 20% less a sample, not "+60%"; a batch size 9%
    larger (under ``BATCH_SIZE_CHANGE_SHARE``) keeps the step's change."""
    h = History()
    h.add(make_entry(step_ms=20.0, cell_id="c1"))  # batches of 8
    doubled = h.add(make_entry(step_ms=32.0, cell_id="c1"))
    doubled.summary = replace(doubled.summary, batch_size=16)
    rows = history_table(h)
    assert rows[1]["per_sample"] and rows[1]["step_change"] == pytest.approx(-0.2)
    assert render_history_text(h).splitlines()[2].rstrip().endswith("\u221220% a sample vs #1")
    for size, per_sample in ((109, False), (110, True)):
        h = History()
        first = h.add(make_entry(step_ms=20.0, cell_id="c1"))
        first.summary = replace(first.summary, batch_size=100)
        later = h.add(make_entry(step_ms=22.0, cell_id="c1"))
        later.summary = replace(later.summary, batch_size=size)
        row = history_table(h)[1]
        assert row["per_sample"] is per_sample
        expected = 22.0 / size / 0.2 - 1 if per_sample else 0.1
        assert row["step_change"] == pytest.approx(expected, rel=0.02)


# --- persistence -------------------------------------------------------------------------------------
def full_history() -> History:
    h = History()
    h.add(make_entry("baseline", cell_id="c1", source=CELL))
    h.add(make_entry("tuned", cell_id="c1", source=CELL_TUNED, status="interrupted"))
    return h


def test_save_and_load_round_trip(tmp_path):
    h = full_history()
    path = tmp_path / "history.json"
    assert h.save(path) == str(path)
    data = json.loads(path.read_text())
    assert data["format"] == "traceml_nb.history" and data["version"] == 1
    loaded = History()
    loaded.add(make_entry("to be replaced"))
    assert loaded.load(path) == 2
    assert [e.to_dict() for e in loaded.entries] == [e.to_dict() for e in h.entries]
    assert loaded.get("tuned").diagnosis == h.get("tuned").diagnosis
    assert loaded.previous_of(loaded.get(2)) is loaded.get(1)
    assert loaded.add(make_entry()).id == 3  # numbering continues


def test_nan_is_saved_as_null(tmp_path):
    h = full_history()
    h.entries[0].summary.step_ms_p10 = float("nan")
    path = tmp_path / "h.json"
    h.save(path)
    assert json.loads(path.read_text())["runs"][0]["summary"]["step_ms_p10"] is None


def assert_rejected(h: History, path, message: str) -> None:
    before = [e.to_dict() for e in h.entries]
    with pytest.raises(HistoryFileError) as info:
        h.load(path)
    assert message in str(info.value)
    assert [e.to_dict() for e in h.entries] == before  # untouched
    assert h.add(make_entry()).id == len(before) + 1
    h.entries.pop()
    h._next_id -= 1  # undo the probe


def test_corrupt_foreign_and_wrong_version_files_leave_the_history_untouched(tmp_path):
    h = full_history()
    good = tmp_path / "good.json"
    h.save(good)
    data = json.loads(good.read_text())

    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(good.read_text()[:-40])
    assert_rejected(h, corrupt, "is not valid JSON")

    foreign = tmp_path / "notebook.json"
    foreign.write_text(json.dumps({"cells": [], "nbformat": 4}))
    assert_rejected(
        h, foreign, 'is not a traceml_nb history file (no "format": "traceml_nb.history")'
    )
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2, 3]")
    assert_rejected(h, listing, "is not a traceml_nb history file")

    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**data, "version": 2}))
    assert_rejected(
        h, newer, "is a traceml_nb history of version 2; this traceml_nb reads version 1"
    )

    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\x80\x04\x95pickle")
    assert_rejected(h, binary, "not UTF-8 text")

    assert_rejected(h, tmp_path / "missing.json", "cannot read history file")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("summary"), "run 1 of 2: 'summary' is missing"),
        (lambda r: r.update(step_ms=["1"]), "run 1 of 2: 'step_ms' must be a list of numbers"),
        (
            lambda r: r.update(status="exploded"),
            "run 1 of 2: 'status' must be one of completed, failed, interrupted",
        ),
        (lambda r: r.update(id=True), "run 1 of 2: 'id' must be a positive integer"),
        (
            lambda r: r["summary"].pop("steady_steps"),
            "run 1 of 2: summary or diagnosis is incomplete",
        ),
        (
            lambda r: r["diagnosis"].update(verdict=3),
            "run 1 of 2: 'diagnosis.verdict' must be a string",
        ),
        (lambda r: r.update(source=["x"]), "run 1 of 2: 'source' must be a string or null"),
    ],
)
def test_malformed_runs_are_rejected(tmp_path, mutate, message):
    h = full_history()
    path = tmp_path / "h.json"
    h.save(path)
    data = json.loads(path.read_text())
    mutate(data["runs"][0])
    path.write_text(json.dumps(data))
    assert_rejected(h, path, message)


def test_duplicate_ids_nan_and_next_id_are_rejected(tmp_path):
    h = full_history()
    path = tmp_path / "h.json"
    h.save(path)
    data = json.loads(path.read_text())
    dup = {**data, "runs": [data["runs"][0], data["runs"][0]]}
    path.write_text(json.dumps(dup))
    assert_rejected(h, path, "run ids must be unique and increasing")
    path.write_text(json.dumps({**data, "next_id": 1}))
    assert_rejected(h, path, "'next_id' must be an integer above every run id")
    path.write_text(path.read_text().replace('"elapsed_s": ', '"elapsed_s": NaN, "x": ', 1))
    assert_rejected(h, path, "NaN is not allowed in a history file")


def test_save_is_atomic(tmp_path, monkeypatch):
    h = full_history()
    path = tmp_path / "history.json"
    h.save(path)
    original = path.read_bytes()
    h.add(make_entry("newer"))

    def crash(obj, fh, **kwargs):
        fh.write('{"format": "traceml_nb.history", "runs": [')  # half a file...
        raise OSError("disk full")  # ...then the crash

    monkeypatch.setattr(history_file_mod.json, "dump", crash)
    with pytest.raises(OSError, match="disk full"):
        h.save(path)
    assert path.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["history.json"]  # no temporary file left behind
    monkeypatch.undo()
    reloaded = History()
    assert reloaded.load(path) == 2


def test_jobs_sharing_an_id_are_told_apart_where_a_rank_stores_again():
    """torchrun's static rendezvous gives every job the id ``none``: two such jobs are two rows
    of ``%traceml history --all``, each in rank order, and runs alone stay rows of their own."""
    from traceml_nb.views.history_table import group_jobs

    def row(id_, rank=None, job=None, name="train"):
        return SimpleNamespace(id=id_, rank=rank, job_id=job, name=name)

    rows = [
        row(1, 1, "none"),
        row(2, 0, "none"),
        row(3),
        row(4, 0, "none"),  # rank 0 again: the next job
        row(5, 1, "none"),
        row(6, 0, "none", name="other"),  # another name: another job
    ]
    groups = [[r.id for r in g] for g in group_jobs(rows)]
    assert groups == [[2, 1], [3], [4, 5], [6]]
