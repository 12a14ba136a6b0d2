"""The step time of a loader with workers: blocks of whole rounds of its workers.

torch hands the workers' batches over in turn; where they cannot keep up, a round of W workers
is one long wait and W - 1 fast steps (measured: 0.4, 0.4 and 34 ms with 3 workers), whose
median is a fast step. The step time's statistics, and the values a comparison judges, are
taken over the means of blocks of whole rounds (:mod:`traceml_nb.analysis.step_blocks`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from builders import RecordBuilder, cpu_capabilities

from traceml_nb.analysis import analyze, compare
from traceml_nb.analysis.step_blocks import block_means, block_steps
from traceml_nb.analysis.thresholds import MIN_STEP_BLOCKS, STEP_BLOCK_STEPS
from traceml_nb.session.history import entry_from


def test_a_block_is_whole_rounds_of_at_least_the_block_steps():
    assert block_steps(0, 1000) == block_steps(1, 1000) == 1  # no rounds: the steps' own
    for workers in range(2, 3 * STEP_BLOCK_STEPS):
        block = block_steps(workers, 1000)
        assert block % workers == 0
        assert STEP_BLOCK_STEPS <= block < STEP_BLOCK_STEPS + workers


def test_a_block_is_shortened_by_whole_rounds_to_make_the_least_blocks_both_sides():
    full = block_steps(3, 10_000)
    assert full == 9
    assert block_steps(3, MIN_STEP_BLOCKS * full) == full
    assert block_steps(3, MIN_STEP_BLOCKS * full - 1) == full - 3
    assert block_steps(3, 5) == 3  # never below one round


def test_block_means_leave_out_a_last_partial_block_unless_it_is_all():
    values = np.arange(10.0)
    assert block_means(values, 1).tolist() == values.tolist()
    assert block_means(values, 4).tolist() == [1.5, 5.5]
    assert block_means(values[:3], 4).tolist() == [1.0]
    assert block_means(np.empty(0), 4).tolist() == []


def _rounds(workers: int, fast_ms: float = 0.4, long_ms: float = 34.0):
    """Step and wait times of a loader whose ``workers`` cannot keep up: each round one long
    wait, the other steps only the compute (``fast_ms``)."""

    def wall(i: int) -> float:
        return long_ms if i % workers == workers - 1 else fast_ms

    def wait(i: int) -> float:
        return wall(i) - fast_ms * 0.75  # a quarter of a fast step is its wait

    return wall, wait


def _run(workers: int, steps: int = 120, rounds_of: int | None = None, wall=None, wait=None):
    b = RecordBuilder()
    b.loader(num_workers=workers, batch_size=8, dataset_type="Slow")
    if wall is None:
        wall, wait = _rounds(rounds_of or workers)
    b.steps(steps, wall, wait)
    record = b.finish()
    analysis = analyze(record, cpu_capabilities(), warmup=0, cpus_available=2)
    run_like = SimpleNamespace(
        name="run", status="completed", error=None, started_at=0.0, elapsed_s=1.0, record=record
    )
    return analysis, entry_from(run_like, analysis)


@pytest.mark.parametrize("workers", [2, 3, 4, 6])
def test_the_step_time_of_workers_that_cannot_keep_up_is_their_pace(workers):
    """Each round's long wait counts once per round: the median of block means is the mean
    step (the run's pace, as its steps per second), where the steps' own median is a fast step
    (from 3 workers on) or the unsteady middle of two kinds (2 workers)."""
    analysis, entry = _run(workers)
    s = analysis.summary
    wall, wait = _rounds(workers)
    mean = float(np.mean([wall(i) for i in range(workers)]))
    assert s.step_block == block_steps(workers, 120) > 1
    assert s.step_ms_median == pytest.approx(mean, rel=1e-3)
    assert s.step_ms_median == pytest.approx(1e3 / s.steps_per_s, rel=1e-3)
    assert s.data_wait_ms_median + s.compute_ms_median == pytest.approx(s.step_ms_median)
    assert s.compute_ms_median == pytest.approx(0.4 * 0.75, rel=1e-3)
    assert len(entry.step_ms) == 120 // s.step_block  # what a comparison resamples
    assert entry.step_ms == pytest.approx([mean] * len(entry.step_ms), rel=1e-3)


def test_one_worker_or_none_keeps_the_steps_own_median():
    """Below two workers there are no rounds: the same steps read their own median (a fast
    step here), as every run did before blocks."""
    wall, wait = _rounds(3)
    analysis, entry = _run(1, wall=wall, wait=wait)
    assert analysis.summary.step_block == 1
    assert analysis.summary.step_ms_median == pytest.approx(0.4)
    assert len(entry.step_ms) == 120


def test_a_fix_to_workers_that_still_cannot_keep_up_is_compared_at_its_pace():
    """``num_workers=0`` (44 ms a step) → 3 workers that cannot keep up (11.6 ms a step on
    average): −74%, as the run's time says, where the steps' medians read −99%."""
    _, before = _run(0, wall=44.0, wait=34.0)
    _, after = _run(3)
    before.id, after.id = 1, 2
    c = compare(before, after)
    assert c.verdict == "faster"
    assert c.step_ratio == pytest.approx(np.mean([0.4, 0.4, 34.0]) / 44.0, rel=1e-3)
    # the bootstrap resamples the blocks: steady blocks, a steady ratio
    assert c.ci_low == pytest.approx(c.step_ratio) and c.ci_high == pytest.approx(c.step_ratio)
