"""When did it change: the runs of a name's history where the step time shifted.

The series is the median step time (ms) of each run of one name on one hardware class, oldest
first. The method is **E-Divisive means** (Matteson & James 2014, "A nonparametric approach for
multiple change point analysis of multivariate data"; as MongoDB's performance CI and
Hunter/Otava use it), on the *log* of the medians so a shift is a ratio whatever the step
length:

1. In a segment, every split ``τ`` with at least ``CHANGE_MIN_RUNS`` runs on each side is
   scored by the energy-distance statistic between the two sides (exponent 1)::

       Q(τ) = m·k/(m+k) · (2·mean|x−y| − mean|x−x'| − mean|y−y'|)

   (``m``, ``k`` the runs on each side; ``x`` left, ``y`` right). The split is the ``τ`` that
   maximises it.
2. Its significance is a permutation test of that maximum: the segment's runs are shuffled
   ``CHANGE_PERMUTATIONS`` times (a fixed seed: the same history always gives the same
   answer), and ``p = (1 + #{shuffles whose best Q ≥ the observed}) / (1 + shuffles)``. A
   split counts when ``p ≤ CHANGE_SIGNIFICANCE``; runs that only differ by noise are
   exchangeable, so that is the chance a history without a shift shows one.
3. Both sides of a significant split are searched again, until no segment splits. Where the
   split would fall with no least runs a side (the statistic's maximum over every ``τ``) is
   fewer than ``CHANGE_MIN_RUNS`` runs from an end, the shift is in those runs and not told
   yet (a late shift would otherwise be placed too early); the rest is searched without them.
4. Shifts smaller than ``CHANGE_MIN_SHIFT`` between the medians of the segments on either
   side are dropped (the smallest first, the segments then joined), so a significant but
   practically nil move of a few percent is not a "change".

A busy-machine run (20–60% slower) is one outlier among its segment: the energy statistic
weighs it by its distance, not its square, and a segment is summed up by its median, so one or
two such runs do not make a shift. Pure: numbers in, :class:`Shifts` out; views write the
words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from .thresholds import (
    CHANGE_MIN_HISTORY,
    CHANGE_MIN_RUNS,
    CHANGE_MIN_SHIFT,
    CHANGE_PERMUTATIONS,
    CHANGE_SIGNIFICANCE,
)

#: The permutation test's seed: a history gives the same change points every time it is read.
SEED = 20140101
#: Shuffles are scored this many at a time; the test stops as soon as the split can no longer
#: be significant (the decision is the same as after all of them, reached sooner on noise).
_BATCH = 100


@dataclass(frozen=True)
class ChangePoint:
    """A shift of the step time: the run at ``index`` (0-based, in the series given) is the
    first of the new level. ``before_ms``/``after_ms``: the median step times (ms) of the runs
    of the segments on each side; ``change`` = after/before − 1 (0.2 = 20% slower);
    ``p_value``: the permutation test's, for the split of the segment it was found in."""

    index: int
    before_ms: float
    after_ms: float
    change: float
    p_value: float


@dataclass
class Shifts:
    """The change points of a series of ``runs`` median step times.

    ``points``: the shifts, oldest first; ``segments``: ``(start, end)`` index ranges (end
    excluded) of the runs between them, and ``segment_ms`` their medians (ms);
    ``judged``: the series had at least ``needed`` runs (``CHANGE_MIN_HISTORY``), otherwise
    no shift is looked for."""

    runs: int
    needed: int
    points: list[ChangePoint] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)
    segment_ms: list[float] = field(default_factory=list)

    @property
    def judged(self) -> bool:
        return self.runs >= self.needed

    @property
    def latest(self) -> ChangePoint | None:
        """The most recent shift, or None."""
        return self.points[-1] if self.points else None

    def at(self, index: int) -> ChangePoint | None:
        """The shift whose first run is ``index``, or None."""
        return next((p for p in self.points if p.index == index), None)


def energy_scores(x: np.ndarray, min_runs: int) -> np.ndarray:
    """The statistic ``Q(τ)`` of every split ``τ = min_runs … n − min_runs`` (columns) of each
    row of ``x`` (shape ``(rows, n)``, ``min_runs ≥ 1``): one row per ordering of the same runs. Vectorised: the
    pairwise distances of each row once, then running sums give every split's three sums."""
    n = x.shape[1]
    distances = np.abs(x[:, :, None] - x[:, None, :])
    row_sums = distances.sum(axis=2)
    # the distances from run j to the runs before it, then their running sum: the pairs
    # within the first t runs
    to_earlier = np.einsum("rij,ij->rj", distances, np.triu(np.ones((n, n)), 1))
    tau = np.arange(min_runs, n - min_runs + 1)
    within_left = np.cumsum(to_earlier, axis=1)[:, tau - 1]
    across = np.cumsum(row_sums, axis=1)[:, tau - 1] - 2 * within_left
    within_right = row_sums.sum(axis=1)[:, None] / 2 - within_left - across
    m = tau.astype(float)
    k = n - m
    pairs_left, pairs_right = np.maximum(m * (m - 1), 1), np.maximum(k * (k - 1), 1)  # 1 run: 0
    energy = 2 * across / (m * k) - 2 * within_left / pairs_left - 2 * within_right / pairs_right
    result: np.ndarray = m * k / (m + k) * energy
    return result


def best_split(
    x: Sequence[float] | np.ndarray,
    *,
    min_runs: int = CHANGE_MIN_RUNS,
    permutations: int = CHANGE_PERMUTATIONS,
    significance: float = CHANGE_SIGNIFICANCE,
    seed: int = SEED,
) -> tuple[int, float] | None:
    """The split of ``x`` (log step times) that maximises the energy statistic and its
    permutation p-value, ``(τ, p)`` with ``τ`` the first index of the right side; None when
    ``x`` is too short to split with ``min_runs`` on each side. A p-value above
    ``significance`` may be a lower estimate (the test stops once the split cannot be
    significant)."""
    values = np.asarray(x, dtype=float)
    n = len(values)
    if n < 2 * min_runs or min_runs < 2:
        return None
    observed = energy_scores(values[None, :], min_runs)[0]
    tau = int(observed.argmax()) + min_runs
    best = float(observed.max()) * (1 - 1e-9)  # ties (float sums in another order) count
    rng = np.random.default_rng(seed)
    allowed = significance * (permutations + 1) - 1  # shuffles at least as extreme, at most
    exceed = done = 0
    while done < permutations:
        batch = min(_BATCH, permutations - done)
        order = np.argsort(rng.random((batch, n)), axis=1)
        exceed += int((energy_scores(values[order], min_runs).max(axis=1) >= best).sum())
        done += batch
        if exceed > allowed:
            break
    return tau, (1 + exceed) / (1 + done)


def change_points(
    medians_ms: Sequence[float],
    *,
    min_runs: int = CHANGE_MIN_RUNS,
    min_history: int = CHANGE_MIN_HISTORY,
    permutations: int = CHANGE_PERMUTATIONS,
    significance: float = CHANGE_SIGNIFICANCE,
    min_shift: float = CHANGE_MIN_SHIFT,
    seed: int = SEED,
) -> Shifts:
    """The shifts of the step time in ``medians_ms`` (each run's median step time in ms, oldest
    first; one name, one hardware class). See the module docstring for the method; each
    parameter defaults to its constant in :mod:`.thresholds`."""
    values = [float(v) for v in medians_ms]
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError("median step times must be positive and finite")
    n = len(values)
    shifts = Shifts(runs=n, needed=max(min_history, 2 * min_runs))
    if not shifts.judged:
        if values:
            shifts.segments, shifts.segment_ms = [(0, n)], [float(median(values))]
        return shifts
    logs = np.log(values)
    found: dict[int, float] = {}
    todo = [(0, n)]
    while todo:
        start, end = todo.pop()
        split = best_split(
            logs[start:end],
            min_runs=min_runs,
            permutations=permutations,
            significance=significance,
            seed=seed,
        )
        if split is None or split[1] > significance:
            continue
        # where the split would be with no least runs a side: a shift in the last (first)
        # runs is not told yet, and the runs before it (after it) are searched without them
        loose = int(energy_scores(logs[None, start:end], 1)[0].argmax()) + 1
        if loose < min_runs or end - start - loose < min_runs:
            todo.append((start + loose, end) if loose < min_runs else (start, start + loose))
            continue
        at = start + split[0]
        found[at] = split[1]
        todo += [(start, at), (at, end)]
    cuts = sorted(found)
    while cuts:  # drop the shifts too small to matter, the smallest first
        medians = _segment_medians(values, cuts)
        moves = [abs(math.log(b / a)) for a, b in zip(medians, medians[1:], strict=False)]
        smallest = min(range(len(moves)), key=moves.__getitem__)
        if math.expm1(moves[smallest]) >= min_shift:
            break
        cuts.pop(smallest)
    bounds = [0, *cuts, n]
    shifts.segments = list(zip(bounds, bounds[1:], strict=False))
    shifts.segment_ms = _segment_medians(values, cuts)
    shifts.points = [
        ChangePoint(
            index=at,
            before_ms=shifts.segment_ms[i],
            after_ms=shifts.segment_ms[i + 1],
            change=shifts.segment_ms[i + 1] / shifts.segment_ms[i] - 1,
            p_value=found[at],
        )
        for i, at in enumerate(cuts)
    ]
    return shifts


def _segment_medians(values: list[float], cuts: list[int]) -> list[float]:
    bounds = [0, *cuts, len(values)]
    return [float(median(values[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]
