"""``python -m traceml_nb export`` and ``import`` in real processes: runs moved between two
stores through a file and through a pipe, each run once; a bad file exits 2 and changes
nothing."""

from __future__ import annotations

import subprocess
import sys

from store_helpers import REPO, cli, make_run

from traceml_nb.session.store import Store


def test_runs_move_through_a_file_each_once_and_a_bad_file_changes_nothing(tmp_path):
    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    store = Store(source)
    for i in range(3):
        entry = make_run("smoke", seed=i)
        entry.started_at += 60.0 * i  # a run's start tells it apart
        store.add(entry, session="colab")
    store.add(make_run("other"), session="colab")
    exported = cli("export", "--name", "smoke", "--store", str(source))
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stdout.splitlines()) == 3
    runs = tmp_path / "runs.jsonl"
    runs.write_text(exported.stdout)
    first = cli("import", str(runs), "--store", str(target))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"traceml_nb import: 3 run(s) added to {target}, 0 already there"
    again = cli("import", str(runs), "--store", str(target))
    assert "0 run(s) added" in again.stdout and "3 already there" in again.stdout
    back = cli("export", "--name", "smoke", "--store", str(target))
    assert back.stdout == exported.stdout  # the round trip is identical

    bad = tmp_path / "bad.jsonl"
    bad.write_text(exported.stdout + "{}\n")
    failed = cli("import", str(bad), "--store", str(target))
    assert failed.returncode == 2
    assert failed.stderr.startswith("traceml_nb import: line 4: not a run exported by traceml_nb")
    missing = cli("export", "--store", str(tmp_path / "none.sqlite"))
    assert missing.returncode == 2 and "there is no store" in missing.stderr
    assert len(Store(target).rows(name="smoke")) == 3


def test_runs_move_through_a_pipe(tmp_path):
    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    Store(source).add(make_run("smoke"), session="kaggle")
    command = f"{sys.executable} -m traceml_nb"
    piped = subprocess.run(
        f"{command} export --store {source} | {command} import - --store {target}",
        shell=True,
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=300,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert "1 run(s) added" in piped.stdout
    assert [e.session_id for e in Store(target).entries([1])] == ["kaggle"]
