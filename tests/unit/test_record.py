"""The run record: compact columns, thread-safe snapshots, bounded samples."""

from __future__ import annotations

import math
import threading

import numpy as np

from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.record import SOURCE_OPTIMIZER, RunRecord, SampleTable
from traceml_nb.engine.step_table import PhaseRows, StepTable


def test_a_step_row_costs_under_100_bytes() -> None:
    table = StepTable()
    for i in range(200_000):
        table.append(i, 10, 3, 8, 0, 0)
    per_row = table.nbytes / len(table)
    assert per_row < 100
    assert per_row == 32  # four int64 a row on a CPU run (GPU columns grow only on CUDA)


def test_the_phases_of_the_few_sampled_rows_are_kept_apart_and_read_back_in_place() -> None:
    table = StepTable()
    rows = [(i, 10, 3, 8, 0, 0) for i in range(1000)]
    phases = [(1, 2, 3, i) if i % 60 == 5 else None for i in range(1000)]
    table.extend(rows[:500], phases[:500])
    table.extend(rows[500:], phases[500:])
    assert table.nbytes / len(table) < 33  # a sampled row in 60 costs 40 bytes
    for start in (0, 5, 6, 700):
        cols = table.snapshot(start)
        optimizer = list(cols.phase_column("optimizer_ns"))
        for i, value in enumerate(optimizer, start=start):
            assert value == i if i % 60 == 5 else math.isnan(value)
        assert [v for v in cols.phase_column("copy_ns") if not math.isnan(v)] == [1.0] * sum(
            1 for i in range(start, 1000) if i % 60 == 5
        )


def test_a_snapshot_and_the_analysis_carry_the_phases_of_the_timed_rows_only() -> None:
    """The phases stay as few as the rows that have them from the table through the snapshot
    and the analysis' selection: a 100,000-step snapshot with one timed row in 60 holds 1,667
    rows of phases, not 100,000 rows of NaN (the analysis of a long run once copied 8 dense
    columns a row, ~12x the record at its peak)."""
    from traceml_nb.analysis.steps import select_rows

    n = 100_000
    table = StepTable()
    rows = [(i, 10, 3, 8, SOURCE_OPTIMIZER, 0) for i in range(n)]  # steps told by the optimizer
    table.extend(rows, [(1, 2, 3, 4) if i % 60 == 0 else None for i in range(n)])
    snap = table.snapshot()
    assert len(snap.phases) == len(range(0, n, 60)) and not len(snap.gpu_phases)
    assert snap.phases.values.nbytes == 32 * len(snap.phases)
    assert snap.tail(61).phases.index[0] == 59  # row 120, counted from row 61
    selection = select_rows(RunRecord(steps=table, optimizer_steps=n).snapshot(samples=False))
    assert len(selection) == n
    assert isinstance(selection.phase_ms, PhaseRows)
    assert len(selection.phase_ms) == len(snap.phases)
    assert selection.phase_ms.values[0].tolist() == [1e-6, 2e-6, 3e-6, 4e-6]  # ns -> ms


def test_phase_rows_taken_at_positions_keep_their_place_among_them() -> None:
    nan = float("nan")
    dense = [[nan] * 4, [1.0] * 4, [nan] * 4, [3.0] * 4, [4.0] * 4]
    phases = PhaseRows.of_dense(dense)
    assert phases.index.tolist() == [1, 3, 4]
    taken = phases.take(np.array([0, 3, 4]))  # rows 0, 3 and 4
    assert taken.index.tolist() == [1, 2] and taken.values[:, 0].tolist() == [3.0, 4.0]
    assert phases.window(2, 5).index.tolist() == [1, 2]
    assert phases.window(3, 4).values[:, 0].tolist() == [3.0]
    restored = phases.dense(5)
    assert [math.isnan(row[0]) for row in restored] == [True, False, True, False, False]
    assert len(PhaseRows.none().take(np.arange(3))) == 0


def test_snapshot_is_a_consistent_copy_while_a_writer_appends() -> None:
    table = StepTable()
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            table.append(i, i, i, i % 100, 0, 0)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        seen = 0
        for _ in range(200):
            snap = table.snapshot(seen)
            n = len(snap)
            assert len(snap.start_ns) == len(snap.wall_ns) == len(snap.batch) == n
            assert list(snap.start_ns) == list(range(seen, seen + n))
            seen += n
    finally:
        stop.set()
        t.join()


def test_pending_gpu_values_are_nan_until_filled() -> None:
    table = StepTable()
    row = table.append(0, 5, 1, 4, 0, 0)
    assert math.isnan(table.gpu_stall_ms[row])
    table.set_gpu(row, 1.5, 2.5)
    snap = table.snapshot()
    assert (snap.gpu_stall_ms[0], snap.gpu_span_ms[0]) == (1.5, 2.5)
    table.append(1, 5, 1, 4, 0, 0)
    assert math.isnan(table.snapshot().gpu_stall_ms[1])


def test_gpu_values_of_rows_resolved_after_a_gap_or_again() -> None:
    table = StepTable()
    for i in range(5):
        table.append(i, 5, 1, 4, 0, 0)
    table.set_gpu(0, 1.0, 2.0)
    table.set_gpu(3, 4.0, 5.0)  # rows 1 and 2 never resolved
    table.set_gpu(1, 6.0, 7.0)  # a row before the last one set
    snap = table.snapshot()
    stall, span = list(snap.gpu_stall_ms), list(snap.gpu_span_ms)
    assert stall[:2] == [1.0, 6.0] and span[:2] == [2.0, 7.0]
    assert math.isnan(stall[2]) and math.isnan(span[2])
    assert (stall[3], span[3]) == (4.0, 5.0)
    assert math.isnan(stall[4]) and math.isnan(span[4])  # pending


def test_packed_rows_decode_every_field() -> None:
    table = StepTable()
    table.append(10, 20, 5, -1, 254, 8)
    table.append(11, 21, 6, 1_000_000, 3, 255)
    snap = table.snapshot()
    assert list(snap.batch) == [-1, 1_000_000]
    assert list(snap.source) == [254, 3] and list(snap.flags) == [8, 255]
    assert list(snap.start_ns) == [10, 11] and list(snap.wait_ns) == [5, 6]
    assert len(table.snapshot(1)) == 1 and table.snapshot(1).offset == 1


def test_samples_are_downsampled_past_the_cap_and_keep_the_whole_run() -> None:
    table = SampleTable(["util"], cap=1000)
    for i in range(100_000):
        table.append(i * 0.1, {"util": i % 100})
    assert len(table) <= 1000
    t = table.snapshot()["t"]
    assert t[0] == 0.0 and t[-1] > 9000  # spread over the whole run
    gaps = {round(t[i + 1] - t[i], 6) for i in range(len(t) - 1)}
    assert len(gaps) == 1  # evenly spread


def test_unavailable_sample_values_are_none_never_zero() -> None:
    table = SampleTable(["util", "power"])
    table.append(0.0, {"util": 50, "power": None})
    table.append(0.1, {"util": 0})
    assert table.column("util") == [50.0, 0.0]
    assert table.column("power") == [None, None]


def test_capabilities_round_trip_and_reasons() -> None:
    caps = Capabilities()
    caps.set("nvml", False, "NVML library not found")
    caps.set("steps", True)
    caps.note("GPU lost at t=3.0s")
    caps.note("GPU lost at t=3.0s")
    assert caps.why("nvml") == "NVML library not found" and caps.why("steps") == ""
    assert caps.why("never-set") == "not measured in this run"
    again = Capabilities.from_dict(caps.to_dict())
    assert again == caps and again.notes == ["GPU lost at t=3.0s"]


def test_record_bytes_include_every_table() -> None:
    rec = RunRecord()
    rec.host = SampleTable(["cpu"])
    rec.host.append(0.0, {"cpu": 1.0})
    rec.steps.append(0, 1, 0, 1, 0, 0)
    assert rec.nbytes >= 32 + 16
