"""Warm-up detection: the leading steps that are not representative of the steady state."""

from __future__ import annotations

import numpy as np

from .thresholds import WARMUP_MAX_SHARE, WARMUP_MIN_STEPS, WARMUP_SLOW_FACTOR

#: ``"auto"`` or a number of steps (any other string is refused with a ValueError).
WarmupSpec = str | int


def detect_warmup(wall_ms: np.ndarray, warmup: WarmupSpec = "auto") -> int:
    """How many leading steps to exclude as warm-up.

    ``warmup`` is ``"auto"`` or a number of steps. ``"auto"``: nothing below
    ``WARMUP_MIN_STEPS`` steps; otherwise the first step, then every following step of the
    leading run of steps slower than ``WARMUP_SLOW_FACTOR`` × the median of the steps that can
    never be warm-up, at most ``WARMUP_MAX_SHARE`` of the steps. An int ``N`` excludes exactly
    ``N`` steps (all of them when the run has fewer).
    """
    n = len(wall_ms)
    if warmup == "auto":
        return _auto(wall_ms)
    if isinstance(warmup, str) and warmup.strip().isdigit():
        warmup = int(warmup)
    if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)):
        raise ValueError(f"warmup must be 'auto' or a number of steps, got {warmup!r}")
    if warmup < 0:
        raise ValueError(f"warmup must not be negative, got {warmup}")
    return min(int(warmup), n)


def _auto(wall_ms: np.ndarray) -> int:
    n = len(wall_ms)
    if n < WARMUP_MIN_STEPS:
        return 0
    cap = max(1, int(n * WARMUP_MAX_SHARE))
    reference = float(np.median(wall_ms[cap:]))
    slow = wall_ms[1:cap] > WARMUP_SLOW_FACTOR * reference
    # the first step, then the leading run of slow steps (all slow: the whole capped prefix)
    return 1 + (int(np.argmin(slow)) if not slow.all() else len(slow))
