"""Which part of the step a change moved: the data wait, the input copy, the forward, the
backward, the optimizer step or the rest, each run's median of it (:mod:`.step_anatomy`)
compared, so that a comparison can say "backward +75%, the rest within 10%".

A part *moved* when its median changed by at least ``PHASE_MOVED_SHARE`` of itself **and** by
at least ``PHASE_MOVED_STEP_SHARE`` of the earlier run's median step: a part of a few
microseconds that doubles moves nothing that matters. A phase that ran in at most half of
the steps (gradient accumulation's optimizer step, whose median is 0) is compared by its median
where it ran, and its time per step by that times how often it ran (:func:`part_ms`). Runs
of other batch sizes, whose step times are judged per sample (:mod:`.comparison`), have their
parts compared per sample too.
"""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Summary
from .step_anatomy import MEDIAN_FIELDS, PHASES
from .thresholds import PHASE_MOVED_SHARE, PHASE_MOVED_STEP_SHARE

#: Each part of a step and the Summary field of its median, ms, in the order of the step.
PART_FIELDS = {"data wait": "data_wait_ms_median", **MEDIAN_FIELDS}
#: The parts as the comparison names them.
PART_NAMES = {"copy": "input copy", "optimizer": "optimizer step", "other": "the rest of the loop"}


@dataclass(frozen=True)
class PhaseShift:
    """``moved``: the parts that moved, as ``(name, before_ms, after_ms)``, the largest move
    first; ``steady``: the names of the parts both runs timed that did not; ``per_sample``:
    the times are a sample's (each run's divided by its batch size), not a step's."""

    moved: tuple[tuple[str, float, float], ...]
    steady: tuple[str, ...]
    per_sample: bool = False


def part_ms(summary: Summary, part: str) -> tuple[float, float] | None:
    """A part of the steps (a key of :data:`PART_FIELDS`) as ``(its time where it ran, its
    time a step)``, ms: its median, both; for a phase that ran in at most half of the steps
    (``Summary.occasional_phases``) its median over the steps it ran in, and that times the
    share of the steps it ran in. None where it was not timed."""
    median = getattr(summary, PART_FIELDS[part])
    if median is None:
        return None
    occasional = summary.occasional_phases.get(part)
    if occasional:
        ran, where = occasional
        return float(where), float(where) * float(ran)
    return float(median), float(median)


def phase_shift(
    before: Summary, after: Summary, batch_sizes: tuple[float, float] | None = None
) -> PhaseShift | None:
    """How the parts of ``after``'s steps differ from ``before``'s, per sample where
    ``batch_sizes`` (each run's) are given; None where the runs do not both have their phases
    timed."""
    size_a, size_b = batch_sizes or (1.0, 1.0)
    step = (before.step_ms_median or 0.0) / size_a
    if not step or before.other_ms_median is None or after.other_ms_median is None:
        return None
    # a phase timed in one run only is in the other's rest of the step: that rest is no match
    one_sided = any((part_ms(before, p) is None) != (part_ms(after, p) is None) for p in PHASES)
    moved, steady = [], []
    for part in PART_FIELDS:
        a, b = part_ms(before, part), part_ms(after, part)
        if a is None or b is None or (part == "other" and one_sided):
            continue
        a, b = (a[0] / size_a, a[1] / size_a), (b[0] / size_b, b[1] / size_b)
        name = PART_NAMES.get(part, part)
        change, per_step = abs(b[0] - a[0]), abs(b[1] - a[1])
        if change >= PHASE_MOVED_SHARE * a[0] and per_step >= PHASE_MOVED_STEP_SHARE * step:
            moved.append((name, a[0], b[0]))
        else:
            steady.append(name)
    moved.sort(key=lambda m: -abs(m[2] - m[1]))
    return PhaseShift(tuple(moved), tuple(steady), batch_sizes is not None)
