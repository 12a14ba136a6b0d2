"""Comparing two runs: the noise model's verdict, the bootstrap interval, the rows."""

from __future__ import annotations

import numpy as np
import pytest
from builders import RecordBuilder, cpu_capabilities

from traceml_nb.analysis import ComparisonRow, analyze, compare
from traceml_nb.analysis.comparison import bootstrap_ratio_ci
from traceml_nb.analysis.findings import Diagnosis, Summary
from traceml_nb.analysis.judge import Judgement
from traceml_nb.analysis.noise import Noise
from traceml_nb.analysis.thresholds import (
    BATCH_SIZE_CHANGE_SHARE,
    BOOTSTRAP_RESAMPLES,
    CHANGE_MARGIN,
)
from traceml_nb.session.history import RunEntry
from traceml_nb.views.comparison_words import band_text, comparison_text, headline

#: a well-known noise: 2% between runs, on 40 degrees of freedom
KNOWN = Noise(sigma=0.02, df=40.0, own_runs=41, own_df=40.0, own_configs=1, step_ms=100.0)


def steps_around(median: float, n: int = 201, spread: float = 0.05, seed: int = 1) -> list[float]:
    """``n`` step times whose median is exactly ``median`` (symmetric noise around it)."""
    rng = np.random.default_rng(seed)
    half = np.abs(rng.normal(0, spread * median, n // 2))
    values = np.concatenate([median - half, [median], median + half])
    rng.shuffle(values)
    return [float(v) for v in values]


def entry(
    run_id: int,
    step_ms: list[float],
    *,
    batch: int | None = 64,
    wait: float | None = 0.1,
    util: float | None = 90.0,
    mem: float | None = 8192.0,
    verdict: str = "compute-bound",
) -> RunEntry:
    median = float(np.median(step_ms)) if step_ms else None
    per_s = 1000 / median if median else None
    summary = Summary(
        step_source="dataloader",
        total_steps=len(step_ms) + 1,
        warmup_steps=1,
        steady_steps=len(step_ms),
        elapsed_s=sum(step_ms) / 1000,
        warmup_s=0.5,
        step_ms_median=median,
        step_ms_p10=None,
        step_ms_p90=None,
        step_ms_mean=None,
        data_wait_ms_median=None,
        compute_ms_median=None,
        data_wait_share=wait,
        first_fetch_ms=None,
        batch_size=batch,
        samples_per_s=per_s * batch if per_s and batch else None,
        steps_per_s=per_s,
        gpu_stall_share=None,
        gpu_util_median_pct=util,
        gpu_mem_peak_mb=mem,
        gpu_mem_total_mb=16384.0,
        process_cpu_median_pct=None,
        workers_cpu_median_pct=None,
        system_cpu_median_pct=None,
        cpus_available=2,
    )
    diagnosis = Diagnosis(verdict=verdict, title=verdict, confidence="high")
    return RunEntry(
        id=run_id,
        name=f"run{run_id}",
        cell_id=None,
        source=None,
        status="completed",
        error=None,
        started_at=0.0,
        elapsed_s=summary.elapsed_s,
        summary=summary,
        diagnosis=diagnosis,
        step_ms=step_ms,
    )


def test_sm_activity_is_a_row_where_either_run_had_it():
    before, after = entry(1, steps_around(100.0)), entry(2, steps_around(80.0, seed=2))
    assert "SM activity" not in [r.label for r in compare(before, after).rows]  # CPU, T4: none
    before.summary.sm_active_median_pct = 40.0
    after.summary.sm_active_median_pct = 71.0
    rows = compare(before, after).rows
    assert rows[3].label == "GPU utilisation"
    assert rows[4] == ComparisonRow("SM activity", "40%", "71%", "+31 pts", "good")
    after.summary.sm_active_median_pct = None  # the candidate ran where GPM is missing
    assert compare(before, after).rows[4].delta == "\u2014"


def test_mfu_is_a_row_where_either_run_had_it():
    before, after = entry(1, steps_around(100.0)), entry(2, steps_around(80.0, seed=2))
    assert "MFU" not in [r.label for r in compare(before, after).rows]  # a CPU: no peak
    before.summary.mfu, after.summary.mfu = 0.20, 0.31
    rows = {r.label: r for r in compare(before, after).rows}
    assert rows["MFU"] == ComparisonRow("MFU", "20%", "31%", "+11 pts", "good")
    after.summary.mfu = None  # the candidate ran on a GPU not in the table
    assert {r.label: r for r in compare(before, after).rows}["MFU"].delta == "\u2014"


def test_an_mfu_that_is_a_lower_bound_reads_so_and_changes_only_against_a_like_one():
    """Operators without a FLOP formula ran (their work is not in the MFU): "at least", and a
    change in points only where the same operators went uncounted in both runs."""
    before, after = entry(1, steps_around(100.0)), entry(2, steps_around(80.0, seed=2))
    before.summary.mfu, after.summary.mfu = 0.20, 0.31
    kernel = "xformers::efficient_attention_forward_cutlass"
    after.summary.uncounted_ops = [kernel]  # the candidate ran a kernel without a formula
    row = {r.label: r for r in compare(before, after).rows}["MFU"]
    assert row == ComparisonRow("MFU", "20%", "at least 31%", "\u2014", "neutral")
    before.summary.uncounted_ops = [kernel]
    row = {r.label: r for r in compare(before, after).rows}["MFU"]
    assert row == ComparisonRow("MFU", "at least 20%", "at least 31%", "+11 pts", "good")


def test_a_decided_change_says_which_part_of_the_step_moved():
    from traceml_nb.analysis.phase_shift import phase_shift
    from traceml_nb.views.comparison_words import headline

    before, after = entry(1, steps_around(100.0)), entry(2, steps_around(200.0, seed=2))
    for summary, backward in ((before.summary, 40.0), (after.summary, 140.0)):
        summary.data_wait_ms_median, summary.copy_ms_median = 5.0, 2.0
        summary.forward_ms_median, summary.optimizer_ms_median = 30.0, 10.0
        summary.backward_ms_median, summary.other_ms_median = backward, 13.0
    after.summary.copy_ms_median = 4.0  # doubled, but 2 ms of a 100 ms step: not a move
    c = compare(before, after)
    assert c.verdict == "slower" and c.phase_shift is not None
    assert c.phase_shift.moved == (("backward", 40.0, 140.0),)
    assert "input copy" in c.phase_shift.steady
    assert headline(c).endswith("; backward 40 ms \u2192 140 ms (+250%), the other parts steady")
    # both thresholds: 10% of the part itself and 5% of the step (100 ms)
    before.summary.step_ms_median = 100.0
    after.summary.backward_ms_median = 45.0  # +5 ms: 12.5% of itself, 5% of the step
    assert phase_shift(before.summary, after.summary).moved == (("backward", 40.0, 45.0),)
    after.summary.backward_ms_median = 44.9  # under 5% of the step
    assert phase_shift(before.summary, after.summary).moved == ()
    before.summary.backward_ms_median = 60.0
    after.summary.backward_ms_median = 65.9  # 5.9% of the step, under 10% of itself
    assert phase_shift(before.summary, after.summary).moved == ()
    after.summary.forward_ms_median = None  # the candidate's model's forward was not seen
    shift = phase_shift(before.summary, after.summary)
    assert shift is not None and shift.moved == ()
    # its time is in the candidate's rest of the loop alone: that rest is compared with nothing
    assert "the rest of the loop" not in shift.steady and "forward" not in shift.steady
    assert "backward" in shift.steady and "input copy" in shift.steady
    after.summary.other_ms_median = None  # the candidate timed no phases
    assert phase_shift(before.summary, after.summary) is None
    assert "the other parts" not in headline(compare(before, after))


def test_a_phase_in_few_of_the_steps_moves_by_its_time_where_it_ran():
    """Gradient accumulation: the optimizer steps on one step in four, its median 0 ms in
    both runs; doubled where it ran (2 -> 4 ms, 0.5 ms a step of a 10 ms step) it moved, and
    its row says so; the same where it ran, it is steady."""
    from traceml_nb.analysis.phase_shift import phase_shift

    before, after = entry(1, steps_around(10.0)), entry(2, steps_around(10.5, seed=2))
    for summary, where in ((before.summary, 2.0), (after.summary, 4.0)):
        summary.step_ms_median = 10.0
        summary.copy_ms_median, summary.forward_ms_median = 0.1, 3.0
        summary.backward_ms_median, summary.optimizer_ms_median = 4.0, 0.0
        summary.other_ms_median = 2.0
        summary.occasional_phases = {"optimizer": [0.25, where]}
    assert phase_shift(before.summary, after.summary).moved == (("optimizer step", 2.0, 4.0),)
    rows = {r.label: r for r in compare(before, after).rows}
    assert rows["optimizer step"] == ComparisonRow(
        "optimizer step", "2 ms", "4 ms", "+100%", "neutral"
    )
    after.summary.occasional_phases = {"optimizer": [0.25, 2.1]}
    assert "optimizer step" in phase_shift(before.summary, after.summary).steady
    # +0.4 ms where it ran (+20%) is 0.1 ms a step: under 5% of the step, steady
    after.summary.occasional_phases = {"optimizer": [0.25, 2.4]}
    assert "optimizer step" in phase_shift(before.summary, after.summary).steady


def test_each_phase_both_runs_timed_is_a_row_that_says_where_the_step_moved():
    before, after = entry(1, steps_around(100.0)), entry(2, steps_around(130.0, seed=2))
    assert not {"forward", "backward"} & {r.label for r in compare(before, after).rows}
    for summary, backward in ((before.summary, 40.0), (after.summary, 70.0)):
        summary.copy_ms_median, summary.forward_ms_median = 2.0, 30.0
        summary.backward_ms_median, summary.optimizer_ms_median = backward, 10.0
    rows = {r.label: r for r in compare(before, after).rows}
    assert rows["backward"] == ComparisonRow("backward", "40 ms", "70 ms", "+75%", "neutral")
    assert rows["forward"].delta == rows["input copy"].delta == rows["optimizer step"].delta
    assert rows["forward"].delta == "±0%"
    after.summary.backward_ms_median = None  # the candidate timed no backward
    assert "backward" not in {r.label for r in compare(before, after).rows}


def test_the_motivating_comparison():
    before = entry(1, steps_around(316.0), wait=0.44, util=51.0, mem=6000.0, verdict="input-bound")
    after = entry(2, steps_around(179.0, seed=2), wait=0.02, util=93.0, mem=6100.0)
    c = compare(before, after)
    assert (c.baseline_id, c.candidate_id) == (1, 2)
    assert c.verdict == "faster"
    assert c.significant
    said = (
        "step time 316 ms \u2192 179 ms (\u221243%, faster, beyond the run-to-run noise "
        "(\u221241%/+68%: assumed for 316 ms steps until reruns tell))"
    )
    assert headline(c) == said
    assert (c.before_ms, c.after_ms) == (pytest.approx(316), pytest.approx(179))
    assert c.step_ratio == pytest.approx(179 / 316)
    assert c.ci_low < c.step_ratio < c.ci_high < 1
    assert c.rows == [
        ComparisonRow("median step time", "316 ms", "179 ms", "\u221243%", "good"),
        ComparisonRow("throughput", "203 samples/s", "358 samples/s", "+77%", "good"),
        ComparisonRow("data wait", "44%", "2%", "\u221242 pts", "good"),
        ComparisonRow("GPU utilisation", "51%", "93%", "+42 pts", "good"),
        ComparisonRow("peak GPU memory", "5.9 GiB", "6.0 GiB", "+2%", "neutral"),
        ComparisonRow("verdict", "input-bound", "compute-bound", "changed", "good"),
    ]
    text = comparison_text(c)
    assert text.splitlines()[0] == f"#2 vs #1: {said}"
    assert c.to_dict()["rows"][0] == {
        "label": "median step time",
        "before": "316 ms",
        "after": "179 ms",
        "delta": "\u221243%",
        "direction": "good",
    }


def test_slower():
    c = compare(
        entry(1, steps_around(100.0)),
        entry(2, steps_around(130.0, seed=3), verdict="host-bound"),
        noise=KNOWN,
    )
    assert c.verdict == "slower"
    assert headline(c) == (
        "step time 100 ms \u2192 130 ms (+30%, slower, beyond the run-to-run noise "
        "(\u00b17.9%: 41 runs of this configuration))"
    )
    assert c.rows[0].direction == "bad"
    assert c.rows[1].direction == "bad"
    assert c.rows[-1] == ComparisonRow("verdict", "compute-bound", "host-bound", "changed", "bad")


def test_identical_runs_are_no_significant_change():
    values = steps_around(50.0)
    c = compare(entry(1, values), entry(2, list(values)), noise=KNOWN)
    assert c.verdict == "no significant change"
    assert not c.significant
    assert headline(c) == (
        "step time 50 ms \u2192 50 ms (\u00b10%, no significant change: within the run-to-run "
        "noise (\u00b17.9%: 41 runs of this configuration))"
    )
    assert c.ci_low <= 1 <= c.ci_high
    assert [r.direction for r in c.rows] == ["neutral"] * 6
    assert c.rows[-1].delta == "same"


def test_the_change_must_reach_half_the_margin_both_sides():
    """A change the noise model is sure of still needs CHANGE_MARGIN / 2 to be called."""
    base = steps_around(100.0, spread=0.001)
    tight = Noise(sigma=0.002, df=40.0, own_runs=41, own_df=40.0, own_configs=1)
    half = CHANGE_MARGIN / 2
    just_below = [v * (1 + half - 0.002) for v in base]
    c = compare(entry(1, base), entry(2, just_below), noise=tight)
    assert c.ci_low > 1 and c.judgement.low > 0  # both intervals would call it slower...
    assert c.verdict == "no significant change"  # ...but the change is below half the margin
    just_above = [v * (1 + half + 0.002) for v in base]
    assert compare(entry(1, base), entry(2, just_above), noise=tight).verdict == "slower"
    faster = [v * (1 - half - 0.002) for v in base]
    assert compare(entry(1, base), entry(2, faster), noise=tight).verdict == "faster"


def test_a_change_the_noise_cannot_tell_is_inconclusive_and_says_what_would_decide():
    values = steps_around(100.0, spread=0.001)
    wide = Noise(sigma=0.05, df=4.0, step_ms=100.0)
    c = compare(entry(1, values), entry(2, [v * 1.15 for v in values]), noise=wide)
    assert c.verdict == "inconclusive" and not c.significant
    assert c.judgement.more_needed is not None and c.judgement.more_needed >= 1
    said = headline(c)
    assert f"{c.judgement.more_needed} more run" in said
    assert "inconclusive: 1 run against 1 can tell only a change beyond" in said
    assert "at a run-to-run noise of 5.0% (assumed for 100 ms steps until reruns tell)" in said
    several = [entry(i, [v * (1 + 0.01 * i) for v in values]) for i in (1, 2, 3)]
    c = compare(several[-1], entry(4, [v * 1.15 for v in values]), before=several, noise=wide)
    assert c.verdict == "inconclusive"
    assert "inconclusive: 3 runs against 1 can tell only a change beyond" in headline(c)


def test_steps_that_overlap_keep_a_run_level_change_inconclusive():
    rng = np.random.default_rng(5)
    noisy_a = list(rng.lognormal(np.log(100), 0.8, 15))
    noisy_b = [v * 1.3 for v in rng.lognormal(np.log(100), 0.8, 15)]
    c = compare(entry(1, noisy_a), entry(2, noisy_b), noise=KNOWN)
    assert c.ci_low <= 1 <= c.ci_high
    assert c.judgement.verdict in ("slower", "faster")
    assert c.verdict == "inconclusive" and c.steps_overlap
    assert "the runs' own steps overlap" in headline(c)


def test_bootstrap_is_deterministic_and_uses_enough_resamples():
    assert BOOTSTRAP_RESAMPLES >= 1000
    a = np.array(steps_around(10.0, n=4000))
    b = np.array(steps_around(9.0, n=4000, seed=7))
    first = bootstrap_ratio_ci(a, b)
    assert first == bootstrap_ratio_ci(a, b)
    low, high = first
    assert low < 0.9 < high


def test_unavailable_metrics_are_neutral_dashes():
    a = entry(1, steps_around(20.0), batch=None, util=None, mem=None, wait=None)
    b = entry(2, steps_around(10.0), batch=None, util=None, mem=None, wait=None)
    c = compare(a, b)
    assert c.rows[1] == ComparisonRow("throughput", "50 steps/s", "100 steps/s", "+100%", "good")
    assert c.rows[2] == ComparisonRow(
        "data wait", "unavailable", "unavailable", "\u2014", "neutral"
    )
    assert c.rows[3] == ComparisonRow(
        "GPU utilisation", "unavailable", "unavailable", "\u2014", "neutral"
    )
    assert c.rows[4] == ComparisonRow(
        "peak GPU memory", "unavailable", "unavailable", "\u2014", "neutral"
    )


def test_small_share_changes_are_neutral():
    a = entry(1, steps_around(20.0), wait=0.10, util=90.0)
    b = entry(2, steps_around(20.0, seed=4), wait=0.11, util=91.0)
    c = compare(a, b)
    assert c.rows[2].direction == "neutral"
    assert c.rows[3].direction == "neutral"


def test_runs_without_steady_steps_are_not_comparable():
    c = compare(entry(1, steps_around(20.0)), entry(2, []))
    assert c.verdict == "no significant change"
    assert c.step_ratio is None and c.ci_low is None
    assert c.no_steady_ids == [2]
    assert headline(c) == "step time not comparable: #2 has no steady steps"
    assert c.rows[0] == ComparisonRow(
        "median step time", "20 ms", "unavailable", "\u2014", "neutral"
    )
    c = compare(entry(1, []), entry(2, [1.0]))
    assert c.no_steady_ids == [1, 2]
    assert headline(c) == "step time not comparable: #1 and #2 have no steady steps"


def test_compare_entries_built_from_analyses():
    from types import SimpleNamespace

    from traceml_nb.session.history import entry_from

    def run(wait_ms: float, caps):
        b = RecordBuilder()
        b.loader(num_workers=0, batch_size=8)
        b.steps(60, 10.0 + wait_ms, wait_ms)
        record = b.finish()
        analysis = analyze(record, caps, cpus_available=2)
        run_like = SimpleNamespace(
            name="run", status="completed", error=None, started_at=0.0, elapsed_s=1.0, record=record
        )
        return analysis, entry_from(run_like, analysis)

    _, slow = run(10.0, cpu_capabilities())
    _, fast = run(0.2, cpu_capabilities())
    slow.id, fast.id = 1, 2
    c = compare(slow, fast)
    assert c.verdict == "faster"
    assert c.rows[2] == ComparisonRow("data wait", "50%", "2%", "\u221248 pts", "good")
    assert c.rows[3] == ComparisonRow(
        "GPU utilisation", "unavailable", "unavailable", "\u2014", "neutral"
    )
    assert c.rows[5] == ComparisonRow("verdict", "input-bound", "compute-bound", "changed", "good")


def test_a_confidence_bound_keeps_one_decimal_below_ten_percent():
    from traceml_nb.analysis.formatting import fmt_confidence, signed_pct_fine

    assert signed_pct_fine(0.003) == "+0.3%" and signed_pct_fine(-0.031) == "\u22123.1%"
    assert signed_pct_fine(0.0004) == "\u00b10.0%"
    assert signed_pct_fine(0.0996) == "+10%" and signed_pct_fine(0.0994) == "+9.9%"
    assert signed_pct_fine(-0.17) == "\u221217%"
    assert fmt_confidence(0.995) == "99.5%" and fmt_confidence(0.9) == "90%"


def test_a_wide_band_is_written_each_way_and_a_narrow_one_as_plus_minus():
    """The bounds are symmetric in log step time: a band that reaches +68% up reaches −40%
    down (a −43% change is beyond it, where "±68%" would read as if it were within); bands
    whose two sides differ by less than a percentage point keep "±"."""

    def band(up: float) -> str:
        return band_text(Judgement(0.0, -up, up, "inconclusive", 0.1, 0.1, 4.0))

    assert band(0.68) == "\u221240%/+68%"
    assert band(0.11) == "\u22129.9%/+11%"  # sides 1.1 points apart
    assert band(0.10) == "\u00b110%"  # 0.9 points apart
    assert band(0.074) == "\u00b17.4%"


def test_runs_of_other_batch_sizes_are_compared_per_sample():
    """Batch 32 → 64: the step 1.0 ms → 1.8 ms is 0.03125 → 0.028125 ms a sample, 10% less
    time for each: faster, however much longer the step. The step time stays in the table,
    without a direction of its own, and the headline says why it is not the verdict."""
    tight = Noise(sigma=0.01, df=40.0, own_runs=41, own_df=40.0, own_configs=1, step_ms=1.0)
    before = entry(1, steps_around(1.0, spread=0.01), batch=32)
    after = entry(2, steps_around(1.8, spread=0.01, seed=2), batch=64)
    c = compare(before, after, noise=tight)
    assert c.batch_sizes == (pytest.approx(32), pytest.approx(64))
    assert c.verdict == "faster"
    assert c.step_ratio == pytest.approx(0.9)
    assert c.ci_low < 0.9 < c.ci_high < 1  # the bootstrap of the per-sample times
    assert c.judged_ms() == (pytest.approx(1.0 / 32), pytest.approx(1.8 / 64))
    assert (c.before_ms, c.after_ms) == (pytest.approx(1.0), pytest.approx(1.8))
    assert headline(c) == (
        "time per sample 0.0312 ms \u2192 0.0281 ms (\u221210%, faster, beyond the run-to-run "
        "noise (\u00b13.9%: 41 runs of this configuration)); the batch size went 32 \u2192 64, "
        "so the steps are compared per sample (step time 1 ms \u2192 1.8 ms, +80%)"
    )
    assert c.rows[:3] == [
        ComparisonRow("time per sample", "0.0312 ms", "0.0281 ms", "\u221210%", "good"),
        ComparisonRow("median step time", "1 ms", "1.8 ms", "+80%", "neutral"),
        ComparisonRow("throughput", "32000 samples/s", "35556 samples/s", "+11%", "good"),
    ]
    assert c.to_dict()["batch_sizes"] == [pytest.approx(32), pytest.approx(64)]
    # the same steps, the batch size the same: the longer step is the slowdown it is
    same = compare(before, entry(2, steps_around(1.8, spread=0.01, seed=2), batch=32), noise=tight)
    assert same.batch_sizes is None and same.verdict == "slower"
    assert headline(same).startswith("step time 1 ms \u2192 1.8 ms (+80%, slower")
    assert [r.label for r in same.rows[:2]] == ["median step time", "throughput"]


def test_a_batch_size_unknown_on_either_side_keeps_the_step_time():
    known = entry(1, steps_around(1.0, spread=0.01), batch=32)
    unknown = entry(2, steps_around(1.8, spread=0.01, seed=2), batch=None)
    for before, after in ((known, unknown), (unknown, known)):
        c = compare(before, after, noise=KNOWN)
        assert c.judgement is not None and c.batch_sizes is None
        assert headline(c).startswith("step time")
        assert c.rows[0].label == "median step time"


def test_a_baseline_of_several_runs_against_a_larger_batch_per_sample():
    from traceml_nb.analysis.baseline import compare_with_baseline

    tight = Noise(sigma=0.01, df=40.0, own_runs=41, own_df=40.0, own_configs=1, step_ms=1.0)
    baseline = [entry(i, steps_around(m, spread=0.01, seed=i), batch=32) for i, m in
                ((1, 0.98), (2, 1.0), (3, 1.02))]  # fmt: skip
    # twice the batch in 2.4 times the step: 20% more time a sample, slower
    c = compare_with_baseline(baseline, entry(4, steps_around(2.4, spread=0.01), batch=64),
                              noise=tight, one_sided=True)  # fmt: skip
    assert c.verdict == "slower" and c.step_ratio == pytest.approx(1.2, rel=1e-3)
    assert c.rows[0].label == "time per sample (mean of 3 runs)"


@pytest.mark.parametrize(("after_batch", "per_sample"), [(109, False), (110, True)])
def test_batch_sizes_are_compared_per_sample_from_a_change_of_batch_size_change_share(
    after_batch, per_sample
):
    """Below ``BATCH_SIZE_CHANGE_SHARE`` (a sampler that buckets by length moves its median
    batch a little between runs) the step time is judged; from it, the time per sample."""
    assert BATCH_SIZE_CHANGE_SHARE == 0.10
    c = compare(
        entry(1, steps_around(10.0), batch=100),
        entry(2, steps_around(10.0, seed=2), batch=after_batch),
        noise=KNOWN,
    )
    assert (c.batch_sizes is not None) is per_sample
    assert headline(c).startswith("time per sample" if per_sample else "step time")
    expected = 100 / after_batch if per_sample else 1.0
    assert c.step_ratio == pytest.approx(expected)


def test_the_parts_of_runs_of_other_batch_sizes_are_compared_per_sample():
    """Batch 32 → 64, a step 100 → 150 ms: per sample the backward went from 1.25 to 0.94 ms
    (its step's 40 → 60 ms) and the optimizer step, 10 ms a step either way, halved; the
    forward, twice as long a step, is the same a sample."""
    before = entry(1, steps_around(100.0, spread=0.01), batch=32)
    after = entry(2, steps_around(150.0, spread=0.01, seed=2), batch=64)
    for summary, scale, backward in ((before.summary, 1, 40.0), (after.summary, 2, 60.0)):
        summary.data_wait_ms_median, summary.copy_ms_median = 5.0 * scale, 2.0 * scale
        summary.forward_ms_median, summary.optimizer_ms_median = 30.0 * scale, 10.0
        summary.backward_ms_median, summary.other_ms_median = backward, 13.0 * scale
    c = compare(before, after, noise=KNOWN)
    assert c.verdict == "faster" and c.batch_sizes == (32, 64)
    assert c.phase_shift is not None and c.phase_shift.per_sample
    assert c.phase_shift.moved == (
        ("backward", 1.25, 0.9375),
        ("optimizer step", 0.3125, 0.15625),
    )
    assert "forward" in c.phase_shift.steady
    assert headline(c).endswith(
        "; per sample: backward 1.25 ms \u2192 0.938 ms (\u221225%), optimizer step 0.312 ms "
        "\u2192 0.156 ms (\u221250%), the other parts steady"
    )
