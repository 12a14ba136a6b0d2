"""Which part of the step a change moved: the data wait, the input copy, the forward, the
backward, the optimizer step or the rest, each run's median of it (:mod:`.step_anatomy`)
compared, so that a comparison can say "backward +75%, the rest within 10%".

A part *moved* when its median changed by at least ``PHASE_MOVED_SHARE`` of itself **and** by
at least ``PHASE_MOVED_STEP_SHARE`` of the earlier run's median step: a part of a few
microseconds that doubles moves nothing that matters.
"""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Summary
from .step_anatomy import MEDIAN_FIELDS
from .thresholds import PHASE_MOVED_SHARE, PHASE_MOVED_STEP_SHARE

#: Each part of a step and the Summary field of its median, ms, in the order of the step.
PART_FIELDS = {"data wait": "data_wait_ms_median", **MEDIAN_FIELDS}
#: The parts as the comparison names them.
PART_NAMES = {"copy": "input copy", "optimizer": "optimizer step", "other": "the rest of the loop"}


@dataclass(frozen=True)
class PhaseShift:
    """``moved``: the parts that moved, as ``(name, before_ms, after_ms)``, the largest move
    first; ``steady``: the names of the parts both runs timed that did not."""

    moved: tuple[tuple[str, float, float], ...]
    steady: tuple[str, ...]


def phase_shift(before: Summary, after: Summary) -> PhaseShift | None:
    """How the parts of ``after``'s steps differ from ``before``'s; None where the runs do not
    both have their phases timed."""
    step = before.step_ms_median
    if not step or before.forward_ms_median is None or after.forward_ms_median is None:
        return None
    moved, steady = [], []
    for part, field_name in PART_FIELDS.items():
        a, b = getattr(before, field_name), getattr(after, field_name)
        if a is None or b is None:
            continue
        name = PART_NAMES.get(part, part)
        change = abs(b - a)
        if change >= PHASE_MOVED_SHARE * a and change >= PHASE_MOVED_STEP_SHARE * step:
            moved.append((name, float(a), float(b)))
        else:
            steady.append(name)
    moved.sort(key=lambda m: -abs(m[2] - m[1]))
    return PhaseShift(tuple(moved), tuple(steady))
