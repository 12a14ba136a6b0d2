"""Step selection, warm-up detection and the summary, on hand-built records."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import (
    CPU_ONLY,
    RecordBuilder,
    cpu_capabilities,
    gpu_capabilities,
)

from traceml_nb.analysis import analyze, detect_warmup, select_steps
from traceml_nb.analysis.findings import Finding, Summary
from traceml_nb.analysis.summary import NO_LOADER
from traceml_nb.analysis.thresholds import WARMUP_MAX_SHARE, WARMUP_SLOW_FACTOR
from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.record import (
    FLAG_INTERLEAVED,
    FLAG_TRUNCATED,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    RunRecord,
)
from traceml_nb.engine.step_table import StepTable
from traceml_nb.views.diagnosis_words import diagnosis_words


# --- step selection -------------------------------------------------------------------------------
def test_markers_take_precedence_over_loader_and_optimizer_rows():
    b = RecordBuilder()
    b.loader()
    b.steps(6, 10.0, 1.0)
    b.steps(4, 25.0, 2.0, source=SOURCE_OPTIMIZER)
    b.steps(3, 30.0, 3.0, source=SOURCE_MARKER)
    cols, source = select_steps(b.finish())
    assert source == "marker"
    assert list(cols.wall_ns) == [30_000_000] * 3
    assert set(cols.source) == {SOURCE_MARKER}


def test_training_loader_rows_count_the_interleaved_step_and_not_the_truncated_one():
    b = RecordBuilder()
    b.loader(batch_size=8)
    b.loader(batch_size=64, training=False)
    b.steps(5, 10.0, 1.0)
    b.steps(1, 500.0, 1.0, flags=FLAG_INTERLEAVED)  # an eval loop ran inside this step
    b.steps(4, 20.0, 5.0, source=1)  # the eval loader's batches
    b.steps(3, 10.0, 1.0)
    b.steps(1, 3.0, 1.0, flags=FLAG_TRUNCATED)
    b.steps(7, 99.0, source=SOURCE_OPTIMIZER)  # another segmentation of the same time
    record = b.finish()
    cols, source = select_steps(record)
    assert source == "dataloader"
    # one count everywhere: the step the eval ran inside is a step of the loop; the truncated
    # one, whose optimizer step never ran, is not
    assert len(cols) == 9
    assert set(cols.source) == {0}
    assert sorted(cols.wall_ns)[-2:] == [10_000_000, 500_000_000]
    for name, code in zip(StepTable.COLUMNS, StepTable.TYPECODES, strict=True):
        assert getattr(cols, name).typecode == code

    analysis = analyze(record, cpu_capabilities(), warmup=0, cpus_available=2)
    summary = analysis.summary
    assert (summary.total_steps, summary.interleaved_steps, summary.steady_steps) == (9, 1, 8)
    assert summary.data_wait_share == pytest.approx(0.1)  # the eval loader's waits stay out
    assert summary.step_ms_median == 10.0  # the statistics leave the interleaved step out
    assert Finding("evaluation-steps-left-out", {"steps": 1}) in analysis.diagnosis.secondary
    assert "1 step that contained an evaluation is left out of the statistics." in (
        diagnosis_words(analysis.diagnosis).also
    )
    [phase] = summary.phases
    assert phase.name == "eval (loader 1)"
    assert phase.batches == 4
    assert phase.total_s == pytest.approx(0.08)
    assert phase.data_wait_share == pytest.approx(0.25)


def test_two_training_loaders_zipped_count_each_step_once():
    b = RecordBuilder()
    b.loader()
    b.loader()
    b.steps(3, 10.0)
    b.steps(3, 10.0, source=1, leads=False)  # fetched after loader 0 in each step
    cols, source = select_steps(b.finish())
    assert source == "dataloader"
    assert len(cols) == 3 and set(cols.source) == {0}


def test_two_training_loaders_used_in_turn_keep_all_steps():
    b = RecordBuilder()
    b.loader()
    b.loader()
    b.steps(3, 10.0)
    b.steps(3, 10.0, source=1)
    cols, _ = select_steps(b.finish())
    assert len(cols) == 6


def test_optimizer_steps_when_no_loader_is_training():
    b = RecordBuilder()
    b.loader(training=False)
    b.steps(5, 4.0, 1.0)
    b.steps(6, 12.0, 2.0, source=SOURCE_OPTIMIZER)
    record = b.finish()
    cols, source = select_steps(record)
    assert source == "optimizer"
    assert len(cols) == 6
    summary = analyze(record, cpu_capabilities(), warmup=0).summary
    assert summary.step_source == "optimizer"
    # the loop trains (on batches of its own), so a loader no optimizer step followed is an
    # evaluation's, as beside a training loader
    assert [p.name for p in summary.phases] == ["eval (loader 0)"]


def test_busiest_loader_when_nothing_trains():
    b = RecordBuilder()
    b.loader(training=False)
    b.loader(training=False)
    b.steps(3, 5.0, source=0)
    b.steps(7, 6.0, source=1)
    b.steps(1, 6.0, source=1, flags=FLAG_TRUNCATED)  # consumed, then the run ended: a step
    record = b.finish()
    cols, source = select_steps(record)
    assert source == "dataloader"
    assert set(cols.source) == {1}
    assert len(cols) == 8
    summary = analyze(record, cpu_capabilities(), warmup=0).summary
    assert [p.name for p in summary.phases] == ["loader 0"]


def test_empty_record():
    cols, source = select_steps(RunRecord())
    assert source == "none"
    assert len(cols) == 0
    analysis = analyze(RunRecord(), cpu_capabilities(), cpus_available=2)
    s = analysis.summary
    assert (s.total_steps, s.steady_steps, s.step_ms_median, s.samples_per_s) == (0, 0, None, None)
    assert s.unavailable["step_ms_median"] == "no steady steps yet"
    assert analysis.diagnosis.verdict == "insufficient-data"


# --- warm-up --------------------------------------------------------------------------------------
def test_warmup_auto_first_step_only_from_five_steps():
    assert detect_warmup(np.array([50.0, 10, 10, 10])) == 0
    assert detect_warmup(np.array([10.0, 10, 10, 10, 10])) == 1  # even when it is not slow


def test_warmup_auto_leading_slow_run_on_both_sides_of_the_factor():
    ref = 10.0
    slow = WARMUP_SLOW_FACTOR * ref
    steps = np.array([900.0, slow + 0.01, slow + 5, slow, 50.0] + [ref] * 45)
    # step 3 is exactly at the factor (not slower): the run of slow steps ends before it
    assert detect_warmup(steps) == 3
    # a slow step after a fast one is not warm-up
    steps = np.array([900.0, ref, 40.0] + [ref] * 47)
    assert detect_warmup(steps) == 1


def test_warmup_auto_is_capped():
    n = 50
    cap = int(n * WARMUP_MAX_SHARE)
    steps = np.array([100.0] * 30 + [10.0] * 20)  # slow for 60% of the run
    assert detect_warmup(steps) == cap


def test_warmup_explicit_and_invalid():
    steps = np.full(20, 10.0)
    assert detect_warmup(steps, 0) == 0
    assert detect_warmup(steps, 7) == 7
    assert detect_warmup(steps, "3") == 3
    assert detect_warmup(steps, 50) == 20
    for bad in (-1, "soon", 2.5, True):
        with pytest.raises(ValueError, match="warmup"):
            detect_warmup(steps, bad)


def test_warmup_reported_separately():
    b = RecordBuilder()
    b.loader()
    b.steps(1, 400.0, 300.0)
    b.steps(2, 90.0, 1.0)
    b.steps(40, 20.0, 1.0)
    s = analyze(b.finish(), cpu_capabilities(), cpus_available=2).summary
    assert (s.total_steps, s.warmup_steps, s.steady_steps) == (43, 3, 40)
    assert s.warmup_s == pytest.approx(0.58)
    assert s.step_ms_median == pytest.approx(20.0)
    assert s.first_fetch_ms == pytest.approx(300.0)
    s = analyze(b.record, cpu_capabilities(), warmup=0, cpus_available=2).summary
    assert (s.warmup_steps, s.steady_steps, s.warmup_s) == (0, 43, 0.0)


@pytest.mark.parametrize("gap", [False, True], ids=["consecutive", "an interleaved step"])
def test_the_steady_steps_are_read_in_place_where_consecutive_and_the_same_either_way(gap):
    """The steady steps' columns are views of the selection's where the steps are consecutive
    (no copy of a million-step run's columns); with a step left out between them, a copy;
    the figures are the same."""
    from traceml_nb.analysis.summary import measure

    b = RecordBuilder()
    b.loader()
    b.steps(1, 400.0, 300.0)  # the warm-up
    b.steps(20, np.arange(20, 40, dtype=float), 1.0)
    if gap:
        b.steps(1, 500.0, 1.0, flags=FLAG_INTERLEAVED)
    b.steps(20, np.arange(40, 60, dtype=float), 1.0)
    record = b.finish()
    m = measure(record.snapshot(), cpu_capabilities())
    assert m.warmup == 1 and list(m.wall_ms) == list(range(20, 60))
    assert np.shares_memory(m.wall_ms, m.selection.wall_ms) is not gap
    assert np.shares_memory(m.flags, m.selection.flags) is not gap
    s = analyze(record, cpu_capabilities(), cpus_available=2).summary
    assert s.steady_steps == 40 and s.step_ms_median == pytest.approx(39.5)


# --- summary numbers -------------------------------------------------------------------------------
def test_step_statistics_and_throughput():
    b = RecordBuilder()
    b.loader(batch_size=16)
    walls = np.arange(1, 101, dtype=float)  # 1..100 ms
    b.steps(100, walls, walls * 0.25, batch=16)
    record = b.finish(tail_ms=50.0)
    s = analyze(record, cpu_capabilities(), warmup=0, cpus_available=2).summary
    assert s.step_source == "dataloader"
    assert s.step_ms_median == pytest.approx(50.5)
    assert s.step_ms_p10 == pytest.approx(np.percentile(walls, 10))
    assert s.step_ms_p90 == pytest.approx(np.percentile(walls, 90))
    assert s.step_ms_mean == pytest.approx(50.5)
    assert s.data_wait_ms_median == pytest.approx(12.625)
    assert s.compute_ms_median == pytest.approx(37.875)
    assert s.data_wait_share == pytest.approx(0.25)
    assert s.batch_size == 16
    assert s.steps_per_s == pytest.approx(100 / 5.05)
    assert s.samples_per_s == pytest.approx(1600 / 5.05)
    assert s.elapsed_s == pytest.approx(5.1)
    assert s.cpus_available == 2


def test_unreadable_batch_size():
    b = RecordBuilder()
    b.loader(batch_size=32)
    b.steps(20, 10.0, batch=-1)
    s = analyze(b.finish(), cpu_capabilities(), warmup=0).summary
    assert s.batch_size == 32  # from the loader's settings
    assert s.samples_per_s == pytest.approx(3200.0)
    b = RecordBuilder()
    b.steps(20, 10.0, batch=-1, source=SOURCE_MARKER)
    s = analyze(b.finish(), cpu_capabilities(), warmup=0).summary
    assert s.batch_size is None and s.samples_per_s is None
    assert (
        s.unavailable["samples_per_s"]
        == "the batch size could not be counted or read from the batches"
    )


def test_no_dataloader_means_data_wait_unavailable_not_zero():
    b = RecordBuilder()
    b.steps(20, 10.0, source=SOURCE_OPTIMIZER)
    s = analyze(b.finish(), cpu_capabilities(), warmup=0).summary
    assert s.data_wait_share is None
    assert s.data_wait_ms_median is None
    assert s.unavailable["data_wait_share"] == NO_LOADER
    assert s.first_fetch_ms is None


def test_gpu_stall_share_counts_resolved_steps_only():
    b = RecordBuilder()
    b.loader()
    b.steps(10, 20.0, 8.0, stall_ms=5.0)
    b.steps(5, 100.0, 8.0, stall_ms=None)  # still pending (live run)
    s = analyze(b.finish(), gpu_capabilities(), warmup=0).summary
    assert s.gpu_stall_share == pytest.approx(0.25)


def test_gpu_stall_unavailable_reasons():
    b = RecordBuilder()
    b.loader()
    b.steps(10, 20.0, 8.0)
    caps = gpu_capabilities(events=False)
    s = analyze(b.finish(), caps).summary
    assert s.gpu_stall_share is None
    assert s.unavailable["gpu_stall_share"] == "CUDA events failed"
    s = analyze(b.record, cpu_capabilities()).summary
    assert s.unavailable["gpu_stall_share"] == CPU_ONLY
    b = RecordBuilder()
    b.steps(10, 20.0, source=SOURCE_MARKER)
    s = analyze(b.finish(), gpu_capabilities()).summary
    assert s.unavailable["gpu_stall_share"] == (
        "GPU input stalls are measured per DataLoader batch, and these steps are not batches"
    )


def test_samples_are_read_over_the_steady_window_only():
    b = RecordBuilder()
    b.loader(num_workers=2)
    b.steps(1, 1000.0, 900.0)  # warm-up: 0..1 s
    b.steps(100, 20.0, 1.0)  # steady: 1..3 s
    b.samples(
        "host",
        proc_cpu_pct=lambda t: 5.0 if t < 1 else 100.0,
        workers_cpu_pct=lambda t: 0.0 if t < 1 else 150.0,
        workers=2,
        sys_cpu_pct=lambda t: 10.0 if t < 1 else 70.0,
        cpus_available=4,
    )
    b.samples(
        "gpu",
        util_gpu_pct=lambda t: 0.0 if t < 1 else 93.0,
        mem_used_mb=lambda t: 1000.0 + 1000.0 * t,
        mem_total_mb=16384.0,
    )
    s = analyze(b.finish(), gpu_capabilities()).summary
    assert s.warmup_steps == 1
    assert s.process_cpu_median_pct == 100.0
    assert s.workers_cpu_median_pct == 150.0
    assert s.system_cpu_median_pct == 70.0
    assert s.gpu_util_median_pct == 93.0
    assert s.gpu_mem_peak_mb == pytest.approx(4000.0)  # the peak is over the whole run
    assert s.gpu_mem_total_mb == 16384.0
    assert s.cpus_available == 4  # from the host sampler when not given


def test_missing_sample_columns_are_unavailable_with_a_reason():
    b = RecordBuilder()
    b.loader(num_workers=2)
    b.steps(50, 20.0, 1.0)
    b.samples("host", proc_cpu_pct=None, sys_cpu_pct=40.0)  # proc CPU never read
    b.samples("gpu", util_gpu_pct=None, mem_used_mb=500.0)
    caps = gpu_capabilities(utilisation=False)
    s = analyze(b.finish(), caps, cpus_available=2).summary
    assert s.process_cpu_median_pct is None
    assert s.unavailable["process_cpu_median_pct"] == "proc_cpu_pct was unavailable in every sample"
    assert s.workers_cpu_median_pct is None
    assert (
        s.unavailable["workers_cpu_median_pct"] == "workers_cpu_pct is not reported by this sampler"
    )
    assert s.gpu_util_median_pct is None
    assert s.unavailable["gpu_util_median_pct"] == "utilisation is not supported on MIG devices"
    assert s.gpu_mem_peak_mb == 500.0
    assert s.gpu_mem_total_mb is None


def test_no_sampler_tables_use_the_capability_reason():
    b = RecordBuilder()
    b.loader()
    b.steps(20, 20.0, 1.0)
    caps = Capabilities()
    caps.set("host", False, "sampling switched off for this run")
    s = analyze(b.finish(), caps, cpus_available=2).summary
    assert s.unavailable["system_cpu_median_pct"] == "sampling switched off for this run"
    assert s.unavailable["gpu_util_median_pct"] == "not measured in this run"


def test_steal_time_is_the_mean_over_the_steady_window():
    b = RecordBuilder()
    b.loader()
    b.steps(1, 1000.0, 900.0)  # warm-up: 0..1 s, the hypervisor took nothing
    b.steps(100, 20.0, 1.0)  # steady: 1..3 s, every other sample (10 of ~20) at 30%
    b.samples(
        "host",
        sys_cpu_pct=50.0,
        steal_pct=lambda t: 0.0 if t < 1 else (30.0 if round(t * 10) % 2 else 0.0),
    )
    caps = cpu_capabilities()
    caps.set("steal_time", True)
    s = analyze(b.finish(), caps, cpus_available=2).summary
    assert 300 / 21 <= s.steal_mean_pct <= 300 / 19  # the mean (the median would be 0)
    assert "steal_mean_pct" not in s.unavailable


def test_steal_time_unavailable_says_why():
    b = RecordBuilder()
    b.loader()
    b.steps(50, 20.0, 1.0)
    b.samples("host", sys_cpu_pct=50.0, steal_pct=None)
    caps = cpu_capabilities()
    caps.set("steal_time", False, "psutil reports no steal time on this platform (darwin)")
    s = analyze(b.finish(), caps, cpus_available=2).summary
    assert s.steal_mean_pct is None and s.system_cpu_median_pct == 50.0
    assert s.unavailable["steal_mean_pct"] == (
        "psutil reports no steal time on this platform (darwin)"
    )
    off = cpu_capabilities(host=False)  # no host sampler: its reason, not steal time's
    off.set("steal_time", False, "whatever")
    s = analyze(b.finish(), off, cpus_available=2).summary
    assert s.unavailable["steal_mean_pct"] == "psutil is not installed"
    assert Summary.from_dict({k: v for k, v in s.to_dict().items() if k != "steal_mean_pct"})


def test_samples_outside_a_short_run():
    b = RecordBuilder()
    b.loader()
    b.steps(20, 1.0, 0.1)
    b.samples(
        "host", interval_s=0.5, sys_cpu_pct=40.0
    )  # one sample at t=0, before the steady steps
    s = analyze(b.finish(), cpu_capabilities(), cpus_available=2).summary
    assert s.system_cpu_median_pct is None
    assert s.unavailable["system_cpu_median_pct"] == (
        "no sample fell inside the steady steps: the run was too short for the sampler"
    )


def test_live_record_uses_the_end_of_the_last_step():
    b = RecordBuilder()
    b.loader()
    b.steps(30, 10.0, 5.0, stall_ms=None)
    record = b.record  # not finished: elapsed_ns is still 0
    assert record.elapsed_ns == 0
    analysis = analyze(record, gpu_capabilities())
    assert analysis.summary.elapsed_s == pytest.approx(0.3)
    assert analysis.summary.gpu_stall_share is None
    assert analysis.summary.unavailable["gpu_stall_share"] == "no GPU input stall was resolved yet"
    assert analysis.diagnosis.verdict == "input-bound"  # judged on data wait meanwhile


def test_summary_round_trips_through_json_types():
    b = RecordBuilder()
    b.loader()
    b.steps(30, 10.0, 5.0)
    s = analyze(b.finish(), cpu_capabilities(), cpus_available=2).summary
    data = s.to_dict()
    for key, value in data.items():
        assert value is None or isinstance(value, (int, float, str, list, dict)), key
        if isinstance(value, float):
            assert math.isfinite(value), key
    assert type(s).from_dict(data) == s


def test_worker_cpu_without_workers_is_unavailable_not_zero():
    b = RecordBuilder()
    b.loader(num_workers=0)
    b.steps(50, 20.0, 1.0)
    b.samples("host", proc_cpu_pct=90.0, workers_cpu_pct=0.0, sys_cpu_pct=40.0)
    s = analyze(b.finish(), cpu_capabilities(), cpus_available=2).summary
    assert s.workers_cpu_median_pct is None
    assert "num_workers=0" in s.unavailable["workers_cpu_median_pct"]


def test_the_worker_count_beside_their_cpu_is_of_the_samples_that_read_it():
    # workers that are not persistent run only during an epoch: a sample between epochs sees
    # none, and reads no worker CPU; the count's median over every sample (0) stood beside the
    # CPU's over the samples with workers: "median 30% across 0 workers"
    b = RecordBuilder()
    b.loader(num_workers=2)
    b.steps(1, 100.0, 90.0)
    b.steps(100, 20.0, 1.0)
    between = lambda t: int(t * 10) % 3 == 0  # noqa: E731 (workers alive in 1 sample of 3)
    b.samples(
        "host",
        workers_cpu_pct=lambda t: 60.0 if between(t) else np.nan,
        workers=lambda t: 2 if between(t) else 0,
    )
    d = analyze(b.finish(), gpu_capabilities()).diagnosis
    (worker_cpu,) = [e for e in d.evidence if e.label == "worker CPU"]
    assert worker_cpu.detail.facts["workers"] == 2
