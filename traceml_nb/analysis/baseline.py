"""Baselines: a run judged against several earlier runs, not one.

The baseline of a run is the runs of its own configuration (:mod:`.configuration`), the last
``BASELINE_RUNS`` of them, or, for a run whose configuration is new, the runs of the
configuration before it (or a pinned set): the session and the gate choose them. Their median
step times scatter by the run-to-run noise (:mod:`.noise`), which the verdict takes into
account with how little a few runs tell (:mod:`.judge`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .comparison import SLOWER, Comparison, RunLike, compare
from .noise import Noise
from .thresholds import CHANGE_MARGIN


def compare_with_baseline(
    baseline: Sequence[RunLike],
    candidate: RunLike,
    *,
    after: Sequence[RunLike] | None = None,
    noise: Noise | None = None,
    margin: float = CHANGE_MARGIN,
    one_sided: bool = False,
    after_busy: bool = False,
) -> Comparison:
    """``candidate`` against the runs of ``baseline`` (oldest first; at least one): the table's
    "before" column is the latest baseline run's, but for the step time: the geometric mean of
    the baseline runs' medians. ``noise`` defaults to the baseline runs' own
    (:func:`.noise.estimate_noise`); ``after``: the candidate's runs when it is several
    (``candidate`` the latest); the rest as :func:`.comparison.compare` takes it."""
    if not baseline:
        raise ValueError("a baseline needs at least one run")
    return compare(
        baseline[-1],
        candidate,
        before=baseline,
        after=after,
        noise=noise,
        margin=margin,
        one_sided=one_sided,
        after_busy=after_busy,
    )


def is_regression(comparison: Comparison) -> bool:
    """The gate's comparison (one-sided, against the allowed slowdown) found the run slower."""
    return comparison.verdict == SLOWER


__all__ = ["compare_with_baseline", "is_regression"]
