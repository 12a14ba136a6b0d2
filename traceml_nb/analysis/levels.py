"""The levels of a configuration's step time: its runs between the shifts no setting shows.

The runs of one configuration (same name, code, settings, versions, machine class) differ by the
machine's noise, unless something the configuration does not show moved them: a class edited in
another cell, data on slower storage, a slower disk or network. Pooled as one, such runs read a
shift as noise: a probe slowed its data by 27%, was told "slower" once, and then, the slow runs
joined to the fast ones, "+22%, inconclusive" and "+16%, inconclusive" as the noise grew from
6% to 11%, and a further +21% read "a change this small cannot be told".

So a configuration's runs, oldest first, are split into **levels**. Each run is judged against
its current level's runs as a report judges a run against its baseline (:func:`.noise.
judge_change`, two-sided, ``CHANGE_MARGIN``, the noise of the runs so far, each level around
its own mean, with the default prior): ``LEVEL_CONFIRMATIONS`` runs in a row decided slower (or
faster) begin a new level at the first of them; one alone stays in its level, as the machine's
noise (a busy moment its load did not show); the latest decided so, with too few after it to
tell, is **pending**: in no level (its own noise unknown, it widens no level's).

The noise pools the levels, each around its own mean; a run's baseline is the latest level of
at least ``LEVEL_RUNS`` runs (:func:`baseline_level`), so a lasting slowdown is called slower
until it has held for that many runs, then it is the configuration's level and later changes
are judged against it. Pure: numbers in, level numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence

from .judge import FASTER, SLOWER
from .noise import estimate_noise, judge_change
from .thresholds import CHANGE_MARGIN, LEVEL_CONFIRMATIONS, LEVEL_LOOKBACK, LEVEL_RUNS

#: The level of a run decided apart from its level with too few runs after it to tell.
PENDING = -1


def run_levels(medians_ms: Sequence[float], step_ms: float) -> list[int]:
    """The level of each run (median step times in ms, oldest first; 0 the first level) or
    :data:`PENDING`; the runs before the latest ``LEVEL_LOOKBACK`` are level 0's. ``step_ms``:
    the step length the default noise is taken at (the judged run's)."""
    values = [float(v) for v in medians_ms]
    start = max(0, len(values) - LEVEL_LOOKBACK)
    out = [0] * len(values)
    done: list[list[float]] = []
    current = values[: start + 1]
    level, i = 0, start + 1
    while i < len(values):
        noise = estimate_noise([*done, current], step_ms)
        verdicts = [
            judge_change(current, [v], noise, CHANGE_MARGIN).verdict
            for v in values[i : i + LEVEL_CONFIRMATIONS]
        ]
        moved = verdicts[0] in (SLOWER, FASTER)
        if moved and len(verdicts) < LEVEL_CONFIRMATIONS:
            out[i:] = [PENDING] * (len(values) - i)  # too few runs after it to tell
            break
        if moved and all(v == verdicts[0] for v in verdicts):
            done.append(current)
            level, current = level + 1, []
        current.append(values[i])
        out[i] = level
        i += 1
    return out


def by_level(values: Sequence[float], levels: Sequence[int]) -> list[list[float]]:
    """``values`` grouped by their level, in level order (pending ones left out)."""
    groups: dict[int, list[float]] = {}
    for value, level in zip(values, levels, strict=True):
        if level != PENDING:
            groups.setdefault(level, []).append(value)
    return [groups[k] for k in sorted(groups)]


def baseline_level(levels: Sequence[int]) -> int | None:
    """The level a new run is judged against: the latest with at least ``LEVEL_RUNS`` runs,
    else the latest (None: no run in any level)."""
    counts: dict[int, int] = {}
    for level in levels:
        if level != PENDING:
            counts[level] = counts.get(level, 0) + 1
    if not counts:
        return None
    full = [level for level, n in counts.items() if n >= LEVEL_RUNS]
    return max(full) if full else max(counts)
