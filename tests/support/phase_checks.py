"""A check of the anatomy a trainer's run gets: each timed step's parts fit in its time."""

from __future__ import annotations

from traceml_nb.analysis.steps import select_rows

#: what the parts, each a difference of nanosecond clocks turned into ms, may pass the step by
ROUNDING_MS = 1e-6


def assert_parts_fit(run) -> int:
    """Each timed step's data wait and phases (copy, forward, backward, optimizer) fit in its
    time: a phase counted twice sums past it (Lightning's closure read copy 1.21 ms and
    optimizer 1.38 ms in a 1.73 ms step). Returns how many steps were timed (at least one)."""
    steps = select_rows(run.record.snapshot())
    timed = steps.phase_ms
    parts = steps.wait_ms[timed.index] + timed.values.sum(axis=1)
    assert len(parts), "no step was timed"
    over = parts - steps.wall_ms[timed.index]
    assert (over <= ROUNDING_MS).all(), f"parts past the step by up to {over.max():.3f} ms"
    return len(parts)
