"""Moving runs between stores: export → import → export is identical, importing twice adds
nothing, the target numbers what it adds, and a file that is not ours changes nothing."""

from __future__ import annotations

import json

import pytest
from store_helpers import make_run

from traceml_nb.session.store import Store
from traceml_nb.session.store_transfer import (
    RUN_LINE_FORMAT,
    export_lines,
    export_to_file,
    import_lines,
    read_lines,
)


def run(name: str, i: int, **kw):
    """A run of ``name`` started ``i`` minutes after the others (a run's start tells it apart)."""
    entry = make_run(name, seed=i, step_ms=20.0 + i, **kw)
    entry.started_at += 60.0 * i
    return entry


def filled(path, runs: int = 3) -> Store:
    store = Store(path)
    for i in range(runs):
        store.add(run("smoke", i), session="laptop")
    store.add(run("other", 9), session="laptop")
    return store


def test_export_import_export_is_identical_and_importing_twice_adds_nothing(tmp_path):
    source = filled(tmp_path / "a.sqlite")
    lines = list(export_lines(source, "smoke"))
    assert len(lines) == 3 and all(json.loads(x)["format"] == RUN_LINE_FORMAT for x in lines)
    target = Store(tmp_path / "b.sqlite")
    done = import_lines(target, lines)
    assert (done.added, done.already) == (3, 0)
    assert list(export_lines(target, "smoke")) == lines
    again = import_lines(target, lines)
    assert (again.added, again.already) == (0, 3)
    assert len(target.rows(name="smoke")) == 3
    assert len(list(export_lines(source))) == 4  # every name without one


def test_the_target_numbers_what_it_adds_and_keeps_each_runs_session(tmp_path):
    source = filled(tmp_path / "a.sqlite")
    target = Store(tmp_path / "b.sqlite")
    target.add(run("smoke", 42), session="server")  # @1 there already
    import_lines(target, export_lines(source, "smoke"))
    rows = target.rows(name="smoke")
    assert sorted(r.id for r in rows) == [1, 2, 3, 4]
    moved = target.entries([2, 3, 4])
    assert {e.session_id for e in moved} == {"laptop"}
    assert [e.summary.step_ms_median for e in moved] == [
        e.summary.step_ms_median for e in source.entries([1, 2, 3])
    ]


def test_a_file_that_is_not_ours_changes_nothing_and_names_its_line(tmp_path):
    source = filled(tmp_path / "a.sqlite")
    lines = list(export_lines(source, "smoke"))
    target = Store(tmp_path / "b.sqlite")
    target.add(run("smoke", 42), session="server")
    bad_lines = [
        [lines[0], '{"format": "something else"}'],
        [lines[0], "not json"],
        [lines[0], lines[1].replace('"version":1', '"version":2')],
        [lines[0], lines[1].replace('"step_ms_median":', '"step_ms_median":NaN,"x":')],
        [lines[0], json.dumps({**json.loads(lines[1]), "run": {"name": "smoke"}})],
    ]
    for bad in bad_lines:
        with pytest.raises(ValueError, match="^line 2: "):
            import_lines(target, bad)
    assert len(target.rows(name="smoke")) == 1  # nothing written
    assert read_lines(["", lines[0], "  "])[0][1][2] == "laptop"  # blank lines are skipped


def test_export_to_a_file_writes_the_lines(tmp_path):
    source = filled(tmp_path / "a.sqlite")
    path = tmp_path / "runs.jsonl"
    assert export_to_file(source, str(path), "other") == 1
    assert path.read_text().splitlines() == list(export_lines(source, "other"))
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
