"""Throttling: do steps get slower while the GPU runs at a reduced clock for power or heat?

A GPU sample is *throttled* when a performance-limiting clock-event reason is set (power cap,
thermal, hardware slowdown; see ``THROTTLE_REASON_NAMES``) and the SM clock is below
``THROTTLE_CLOCK_RATIO`` of its maximum; without reasons, the low clock alone counts. Each
steady step takes the state of the sample nearest to its middle. The run is throttled when
enough steps were throttled and they were clearly slower than the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .samples import Window
from .thresholds import (
    THROTTLE_CLOCK_RATIO,
    THROTTLE_MIN_SHARE,
    THROTTLE_MIN_STEPS,
    THROTTLE_REASON_MASK,
    THROTTLE_REASON_NAMES,
    THROTTLE_STEP_FACTOR,
)


@dataclass
class ThrottleFinding:
    """What the clocks say about the steady steps."""

    available: bool
    why: str = ""  #: why it is unavailable
    clock_ratio_median: float | None = None  #: SM clock / max SM clock, median of the window
    clock_mhz_median: float | None = None
    clock_max_mhz: float | None = None
    throttled_steps: int = 0
    steps: int = 0
    slowdown: float | None = None  #: median throttled step / median other step
    excess_share: float = 0.0  #: share of the steady step time the slowdown cost
    reasons: list[str] = field(default_factory=list)  #: reasons seen while throttled
    reasons_whole_window: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.throttled_steps / self.steps if self.steps else 0.0

    @property
    def aligned(self) -> bool:
        """Throttling is aligned with step-time jumps (the ``throttled`` verdict)."""
        others = self.steps - self.throttled_steps
        return (
            self.slowdown is not None
            and self.share >= THROTTLE_MIN_SHARE
            and self.throttled_steps >= THROTTLE_MIN_STEPS
            and others >= THROTTLE_MIN_STEPS
            and self.slowdown >= THROTTLE_STEP_FACTOR
        )


def reason_names(mask: int) -> list[str]:
    """Names of the performance-limiting reasons in an NVML clock-event bit mask."""
    return [name for bit, name in THROTTLE_REASON_NAMES.items() if mask & bit]


def _union(codes: np.ndarray) -> int:
    mask = 0
    for code in np.unique(codes.astype(np.int64)):
        mask |= int(code)
    return mask & THROTTLE_REASON_MASK


def find_throttling(gpu: Window, start_s: np.ndarray, wall_ms: np.ndarray) -> ThrottleFinding:
    """Throttling evidence for the steady steps (``start_s``, ``wall_ms``) from ``gpu``."""
    empty = np.zeros(0)
    t = gpu.columns.get("t", empty)
    clock = gpu.columns.get("sm_clock_mhz", empty)
    clock_max = gpu.columns.get("sm_clock_max_mhz", empty)
    reasons = gpu.columns.get("throttle_reasons", empty)
    have_clock = len(clock_max) > 0 and bool(np.isfinite(clock).any())
    have_reasons = bool(np.isfinite(reasons).any())
    if not len(t) or not (have_clock or have_reasons):
        why = gpu.median("sm_clock_mhz").why or "no clock samples inside the steady steps"
        return ThrottleFinding(available=False, why=why)

    n = len(t)
    ratio = np.full(n, np.nan)
    if have_clock:
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(clock_max > 0, clock / clock_max, np.nan)
    low_clock = ratio < THROTTLE_CLOCK_RATIO  # NaN compares False
    if have_reasons:
        codes = np.where(np.isfinite(reasons), reasons, 0).astype(np.int64)
        limited = (codes & THROTTLE_REASON_MASK) != 0
        throttled = limited & (low_clock | ~np.isfinite(ratio))
    else:
        codes = np.zeros(n, dtype=np.int64)
        throttled = low_clock

    finding = ThrottleFinding(available=True, steps=len(wall_ms))
    if have_clock:
        finite = np.isfinite(ratio)
        finding.clock_ratio_median = float(np.median(ratio[finite])) if finite.any() else None
        finding.clock_mhz_median = float(np.nanmedian(clock))
        finding.clock_max_mhz = float(np.nanmax(clock_max))
    finding.reasons_whole_window = reason_names(_union(codes))
    if not len(wall_ms):
        return finding

    mid = start_s + wall_ms / 2e3
    idx = np.clip(np.searchsorted(t, mid), 1, max(1, n - 1)) if n > 1 else np.zeros(len(mid), int)
    if n > 1:
        nearer_left = np.abs(mid - t[idx - 1]) <= np.abs(t[idx] - mid)
        idx = np.where(nearer_left, idx - 1, idx)
    step_throttled = throttled[idx]
    finding.throttled_steps = int(step_throttled.sum())
    finding.reasons = reason_names(_union(codes[idx][step_throttled]))
    if finding.throttled_steps and finding.throttled_steps < len(wall_ms):
        slow = float(np.median(wall_ms[step_throttled]))
        normal = float(np.median(wall_ms[~step_throttled]))
        if normal > 0:
            finding.slowdown = slow / normal
            excess = np.clip(wall_ms[step_throttled] - normal, 0, None).sum()
            finding.excess_share = float(excess / wall_ms.sum())
    return finding
