"""Change points over a name's stored history: the method on hand-made series, its false alarm
rate and power on simulated histories, ``check --history`` on a real store in a subprocess, and
``%traceml history --name`` in a real IPython shell."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from ipython_shell import traceml_shell
from store_helpers import cli, make_run

from traceml_nb.analysis.changepoints import best_split, change_points, energy_scores
from traceml_nb.analysis.formatting import fmt_ms
from traceml_nb.analysis.thresholds import (
    BATCH_SIZE_CHANGE_SHARE,
    CHANGE_MIN_HISTORY,
    CHANGE_MIN_RUNS,
    CHANGE_MIN_SHIFT,
    DEFAULT_MAX_SLOWDOWN,
)
from traceml_nb.session.shifts import check_history, name_shifts
from traceml_nb.session.store import Store
from traceml_nb.session.store_rows import batch_size_of
from traceml_nb.views.history_table import StoredHistory
from traceml_nb.views.shift_lines import HistoryCheckReport, shift_lines


# --- the method on hand-made series -------------------------------------------------------------
def wiggle(n: int, level: float, amplitude: float = 0.01) -> list[float]:
    """``n`` runs about ``level`` ms, ± ``amplitude`` in a fixed pattern (no randomness)."""
    return [level * (1 + amplitude * math.sin(1.7 * i)) for i in range(n)]


def test_a_clean_20_percent_shift_is_found_at_its_first_slow_run():
    series = wiggle(10, 10.0) + wiggle(10, 12.0)
    shifts = change_points(series)
    assert shifts.judged and len(shifts.points) == 1
    point = shifts.latest
    assert point is not None and point.index == 10
    assert point.before_ms == pytest.approx(10.0, rel=0.01)
    assert point.after_ms == pytest.approx(12.0, rel=0.01)
    assert point.change == pytest.approx(0.20, abs=0.01)
    assert point.p_value <= 0.01
    assert shifts.segments == [(0, 10), (10, 20)]
    assert change_points(series) == shifts  # a fixed seed: the same answer every time


def test_a_speed_up_and_two_shifts():
    series = wiggle(8, 20.0) + wiggle(8, 12.0) + wiggle(8, 15.0)
    shifts = change_points(series)
    assert [p.index for p in shifts.points] == [8, 16]
    assert shifts.points[0].change == pytest.approx(-0.40, abs=0.01)
    assert shifts.points[1].change == pytest.approx(0.25, abs=0.01)


def test_a_shift_smaller_than_the_least_reported_is_not_a_change():
    # significant (the runs barely move), but below CHANGE_MIN_SHIFT
    small = 1 + CHANGE_MIN_SHIFT / 2
    series = wiggle(10, 10.0, 0.002) + wiggle(10, 10.0 * small, 0.002)
    split = best_split(np.log(series))
    assert split is not None and split[0] == 10 and split[1] <= 0.01  # the test sees it...
    assert change_points(series).points == []  # ...and the rule leaves it out
    # just above the least shift, it is reported
    series = wiggle(10, 10.0, 0.002) + wiggle(10, 10.0 * (1 + 1.5 * CHANGE_MIN_SHIFT), 0.002)
    assert [p.index for p in change_points(series).points] == [10]


def test_too_few_runs_on_a_side_or_in_the_history_give_no_shift():
    late = CHANGE_MIN_RUNS - 1  # a shift in the last three runs is not told yet
    series = wiggle(16, 10.0) + wiggle(late, 14.0)
    assert change_points(series).points == []
    series = wiggle(16, 10.0) + wiggle(CHANGE_MIN_RUNS, 14.0)
    assert [p.index for p in change_points(series).points] == [16]
    short = wiggle(CHANGE_MIN_HISTORY // 2, 10.0) + wiggle(CHANGE_MIN_HISTORY // 2 - 1, 14.0)
    shifts = change_points(short)
    assert not shifts.judged and shifts.points == [] and shifts.needed == CHANGE_MIN_HISTORY
    assert shifts.segments == [(0, len(short))]
    assert change_points([]).segments == []
    with pytest.raises(ValueError):
        change_points([10.0, 0.0] * 8)


def test_energy_scores_match_the_definition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(13)
    tau = 5
    left, right = x[:tau], x[tau:]

    def mean_dist(a, b, same):
        d = np.abs(a[:, None] - b[None, :])
        return d.sum() / (len(a) * (len(a) - 1)) if same else d.mean()

    m, k = len(left), len(right)
    energy = (
        2 * mean_dist(left, right, False)
        - mean_dist(left, left, True)
        - mean_dist(right, right, True)
    )
    scores = energy_scores(x[None, :], CHANGE_MIN_RUNS)[0]
    assert scores[tau - CHANGE_MIN_RUNS] == pytest.approx(m * k / (m + k) * energy)


# --- the statistics, as statistics ---------------------------------------------------------------
#: Simulated histories per figure (each a different random history, the same seed every run).
HISTORIES = 1000
#: One run in this many runs on a busy machine.
BUSY_EVERY = 20


def history(rng: np.random.Generator, runs: int, shift: float = 0.0) -> np.ndarray:
    """Median step times (ms) of ``runs`` runs at ~10 ms: run-to-run noise lognormal with a
    sigma of 3-10% (drawn per history), one run in ``BUSY_EVERY`` 20-60% slower (a busy
    machine), and from the middle run on ``shift`` slower."""
    sigma = rng.uniform(0.03, 0.10)
    medians = 10.0 * np.exp(sigma * rng.standard_normal(runs))
    busy = rng.random(runs) < 1 / BUSY_EVERY
    medians[busy] *= 1 + rng.uniform(0.2, 0.6, busy.sum())
    medians[runs // 2 :] *= 1 + shift
    return medians


def test_identical_histories_rarely_show_a_shift():
    """1,000 histories of 20-30 identical runs (noise 3-10% per run, busy-machine runs):
    measured at the defaults, 0.7% show a shift (any size ≥ CHANGE_MIN_SHIFT) and 0.4% a
    slowdown beyond 10% that ``check --history`` would fail (3,000 others: 0.3% and 0.07%)."""
    rng = np.random.default_rng(2024)
    any_shift = gate = 0
    for _ in range(HISTORIES):
        shifts = change_points(history(rng, int(rng.integers(20, 31))))
        any_shift += bool(shifts.points)
        latest = shifts.latest
        gate += latest is not None and latest.change > DEFAULT_MAX_SLOWDOWN
    assert any_shift / HISTORIES <= 0.01, any_shift
    assert gate / HISTORIES <= 0.005, gate


def test_a_shift_in_the_middle_is_found():
    """1,000 histories of 20-30 runs, the second half slower: the shift is found within two
    runs of where it happened in 80% at +20% (80% over 3,000 others) and 33% at +10% (31%):
    the run-to-run noise of these histories (up to 10% a run) hides most +10% shifts."""
    rng = np.random.default_rng(7)
    found = {}
    for shift in (0.10, 0.20):
        hits = 0
        for _ in range(HISTORIES):
            runs = int(rng.integers(20, 31))
            shifts = change_points(history(rng, runs, shift))
            hits += any(abs(p.index - runs // 2) <= 2 and p.change > 0 for p in shifts.points)
        found[shift] = hits / HISTORIES
    assert found[0.20] >= 0.75, found
    assert found[0.10] >= 0.25, found


# --- check --history on a real store -------------------------------------------------------------
def fill(store: Store, medians: list[float], workers: list[int]) -> None:
    for i, (median, num_workers) in enumerate(zip(medians, workers, strict=True)):
        store.add(make_run("smoke", step_ms=median, seed=i, num_workers=num_workers))


@pytest.fixture
def shifted(tmp_path) -> Store:
    """8 runs at ~10 ms with 4 DataLoader workers, then 8 at ~12 ms with none."""
    store = Store(tmp_path / "history.sqlite")
    fill(store, wiggle(8, 10.0, 0.02) + wiggle(8, 12.0, 0.02), [4] * 8 + [0] * 8)
    return store


def test_check_history_fails_on_a_slowdown_that_holds_and_names_what_came_with_it(
    shifted, tmp_path
):
    junit = tmp_path / "gate.xml"
    done = cli(
        "check", "--name", "smoke", "--history", "--store", shifted.path, "--junit", str(junit)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert re.match(
        r"REGRESSION: 'smoke' step time \+20% from @9 \((10|9\.\d+) ms \u2192 12", out
    ), out
    assert "where the DataLoader's num_workers went 4 \u2192 0" in out
    assert "the 8 runs since hold it, beyond the 10% allowed" in out
    assert 'failures="1"' in junit.read_text()
    done = cli("check", "--name", "smoke", "--history", "--store", shifted.path,
               "--max-slowdown", "0.25", "--format", "markdown")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: 'smoke' latest shift: step time +20% from @9" in done.stdout
    assert "within the 25% allowed" in done.stdout
    assert re.search(
        r"\| @9 \| [\d.]+ ms \| [\d.]+ ms \| \+20% \| where the DataLoader's num_workers",
        done.stdout,
    )


def test_check_history_passes_a_flat_history_and_needs_enough_runs(tmp_path):
    flat = Store(tmp_path / "flat.sqlite")
    fill(flat, wiggle(16, 10.0, 0.02), [4] * 16)
    done = cli("check", "--name", "smoke", "--history", "--store", flat.path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 'smoke': no shift of the step time over its 16 runs")
    short = Store(tmp_path / "short.sqlite")
    fill(short, [10.0, 10.1, 9.9], [4] * 3)
    done = cli("check", "--name", "smoke", "--history", "--store", short.path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"change points need {CHANGE_MIN_HISTORY} ({CHANGE_MIN_HISTORY - 3} more)" in done.stdout
    done = cli("check", "--name", "smoke", "--history", "--store", str(tmp_path / "none.sqlite"))
    assert done.returncode == 2 and done.stdout.startswith("ERROR: cannot check"), done.stdout


# --- values that tell runs apart: the history of the latest run's -------------------------------
def fill_given(store: Store, runs: list[tuple[float, str]]) -> None:
    """A CI job's runs of one script, each (median ms, ``--model``) and its own ``--run-name``."""
    from store_helpers import ENV

    from traceml_nb.session.environment import argument_values

    for i, (median, model) in enumerate(runs):
        argv = ["--run-name", f"job-{i}", "--model", model]
        env = {**ENV, "script_sha": "a" * 16, "script_args_sha": f"{i:016x}"}
        env["script_args"] = argument_values(argv)
        store.add(make_run("smoke", step_ms=median, seed=i, source=None, env=env))


def test_check_history_follows_the_runs_given_the_latest_runs_values(tmp_path):
    """``--model small`` and ``big`` in turn: mixed, the series swung by 2x at every run and
    hid a +20% slowdown of the big model (read "no shift"); the big runs' own history finds
    it. A switch for good to ``--model big`` is the history of the big runs from then on."""
    small = wiggle(14, 10.0, 0.02)
    big = wiggle(8, 20.0, 0.02) + wiggle(6, 24.0, 0.02)
    turns = Store(tmp_path / "turns.sqlite")
    in_turn = [(m, "small") for m in small], [(m, "big") for m in big]
    fill_given(turns, [run for pair in zip(*in_turn, strict=True) for run in pair])
    done = cli("check", "--name", "smoke", "--history", "--store", turns.path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.match(r"REGRESSION: 'smoke' step time \+2[01]% from @18 ", done.stdout), done.stdout
    # a --run-name new in every run came with the shift, as with every run: not named
    assert "from @18 (19.9 ms \u2192 24.1 ms), with the same code, settings and" in done.stdout
    assert "given the same arguments (--model)" in done.stdout
    history = name_shifts(turns, "smoke")
    assert len(history.runs) == 14 and history.left_out == {"given other values": 14}
    assert history.split_by == ("--model",)
    table = StoredHistory.of(turns, name="smoke").text
    assert "given" in table.splitlines()[0]
    assert re.search(r"@1 smoke .* --model #1 *\n", table) and "--model #2 \u2190" in table
    assert "given the same arguments (--model) (marked \u2190):" in table
    switched = Store(tmp_path / "switched.sqlite")
    fill_given(switched, [(m, "small") for m in small[:6]] + [(m, "big") for m in big[:8]])
    done = cli("check", "--name", "smoke", "--history", "--store", switched.path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has 8 completed runs with a step time" in done.stdout
    assert "(6 given other values left out)" in done.stdout


def test_the_given_column_names_a_flag_not_given_and_numbers_as_written():
    from types import SimpleNamespace

    from traceml_nb.analysis.variants import ARGUMENT_NAMES
    from traceml_nb.views.history_table import given_cell

    given = {
        1: {"--fp16": "h0", ARGUMENT_NAMES: "--fp16", "HIDDEN": "256"},
        2: {ARGUMENT_NAMES: "", "HIDDEN": "512"},
    }
    history = SimpleNamespace(
        given=given, split_by=(ARGUMENT_NAMES, "--fp16", "HIDDEN"), runs=[SimpleNamespace(id=2)]
    )
    seen: dict[str, list[str]] = {}
    assert given_cell(history, 1, seen) == "--fp16 #1, HIDDEN 256"
    assert given_cell(history, 2, seen) == "no --fp16, HIDDEN 512 \u2190"
    assert given_cell(history, 3, seen) == "\u2014"  # stored before values were recorded


# --- a batch size that changed: the time per sample ----------------------------------------------
def fill_sized(store: Store, medians: list[float], sizes: list[int]) -> None:
    for i, (median, size) in enumerate(zip(medians, sizes, strict=True)):
        store.add(make_run("smoke", step_ms=median, seed=i, batch_size=size))


def test_check_history_judges_the_time_per_sample_where_the_batch_size_changed(tmp_path):
    """8 runs of batches of 32 at ~10 ms a step, then 8 of 64 at ~18 ms: each sample 10%
    faster, which the step time read as "+80%" and failed; at ~24 ms a step, 20% slower a
    sample: a regression."""
    faster = Store(tmp_path / "faster.sqlite")
    fill_sized(faster, wiggle(8, 10.0, 0.02) + wiggle(8, 18.0, 0.02), [32] * 8 + [64] * 8)
    done = cli("check", "--name", "smoke", "--history", "--store", faster.path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.match(
        r"OK: 'smoke' latest shift: time per sample \u221210% from @9 \(0\.3\d+ ms \u2192 "
        r"0\.28\d* ms\), where the DataLoader's batch_size went 32 \u2192 64; not a slowdown",
        done.stdout,
    ), done.stdout
    slower = Store(tmp_path / "slower.sqlite")
    fill_sized(slower, wiggle(8, 10.0, 0.02) + wiggle(8, 24.0, 0.02), [32] * 8 + [64] * 8)
    result = check_history("smoke", store=slower.path)
    assert result.exit_code == 1 and result.to_dict()["per_sample"] is True
    assert result.shift is not None and result.shift.point.change == pytest.approx(0.2, abs=0.03)
    assert HistoryCheckReport(result).text().startswith("REGRESSION: 'smoke' time per sample +2")


def test_a_history_is_per_sample_only_where_every_batch_size_is_known_and_they_differ(tmp_path):
    """Both sides of ``BATCH_SIZE_CHANGE_SHARE`` (100 → 109 stays on the step time, 100 → 110
    is per sample), and a run whose batch size is unknown keeps the whole series on the step
    time; a series that does not shift says per sample why."""
    for size, per_sample in ((109, False), (110, True)):
        store = Store(tmp_path / f"{size}.sqlite")
        fill_sized(store, wiggle(16, 10.0, 0.02), [100] * 8 + [size] * 8)
        history = name_shifts(store, "smoke")
        assert history.per_sample is per_sample
        assert history.batch_sizes == [100] * 8 + [size] * 8
    assert BATCH_SIZE_CHANGE_SHARE == 0.10
    text = "\n".join(shift_lines(history))
    assert "change points of the time per sample (the batch size went 100 \u2192 110)" in text
    with store._connect(write=True) as conn:  # one run whose samples were not counted
        summary = json.loads(conn.execute("SELECT summary FROM runs WHERE id = 3").fetchone()[0])
        summary["batch_size"] = None
        conn.execute("UPDATE runs SET summary = ? WHERE id = 3", [json.dumps(summary)])
    assert [batch_size_of(text) for text in ("{", '{"batch_size": true}', '{"batch_size": 8}')] == [
        None,
        None,
        8,
    ]
    unknown = name_shifts(store, "smoke")
    assert not unknown.per_sample and unknown.batch_sizes[2] is None
    assert shift_lines(unknown)[0].startswith("change points: no shift of the step time over 16")
    flat = Store(tmp_path / "flat.sqlite")
    fill_sized(flat, wiggle(8, 10.0, 0.02) + wiggle(8, 20.0, 0.02), [32] * 8 + [64] * 8)
    assert (
        HistoryCheckReport(check_history("smoke", store=flat.path))
        .text()
        .startswith(
            "OK: 'smoke': no shift of the time per sample (the batch size went 32 \u2192 64) over "
            "its 16 runs"
        )
    )
    table = StoredHistory.of(flat, name="smoke")
    assert list(table.cells[0])[5:8] == ["step", "per sample", "data wait"]
    assert [c["per sample"] for c in table.cells] == [
        fmt_ms(r.step_ms_median / size)
        for r, size in zip(name_shifts(flat, "smoke").runs, [32] * 8 + [64] * 8, strict=True)
    ]


# --- %traceml history --name in a real IPython shell ---------------------------------------------
def test_history_name_marks_the_shift(shifted, monkeypatch, capsys):
    monkeypatch.setenv("TRACEML_NB_STORE", shifted.path)
    with traceml_shell("pass") as ip:
        capsys.readouterr()
        ip.run_line_magic("traceml", "history --name smoke")
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if line.startswith("@9 smoke")]
    assert len(marked) == 1 and marked[0].rstrip().endswith("\u25b2 +20%"), out
    assert not [line for line in out.splitlines() if "\u25b2" in line and "@9" not in line]
    assert "change points over 16 runs on CPU: Test CPU \u00d72:" in out
    assert re.search(
        r"  step time \+20% from @9 \([\d.]+ ms \u2192 [\d.]+ ms\), where the DataLoader's "
        "num_workers went 4 \u2192 0",
        out,
    ), out
