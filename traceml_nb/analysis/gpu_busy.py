"""How busy the GPU was, by the best signal the run has: GPM SM activity where the GPU has it
(Hopper and later), else NVML's utilisation. The host-bound and compute-bound rules read it,
and their titles say which signal decided (``busy_source`` in their facts)."""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Finding, Summary
from .thresholds import GPU_BUSY_PCT, SM_ACTIVE_BUSY_PCT

GPM = "gpm"
NVML = "nvml"


@dataclass(frozen=True)
class BusySignal:
    """``value_pct``: the steady median of the signal, percent 0..100; ``threshold_pct``: at or
    above it the GPU is busy; ``source``: :data:`GPM` (SM activity) or :data:`NVML` (the share
    of time a kernel ran)."""

    value_pct: float
    threshold_pct: float
    source: str

    @property
    def busy(self) -> bool:
        return self.value_pct >= self.threshold_pct

    @property
    def strong(self) -> bool:
        """Far from busy: below half the threshold."""
        return self.value_pct < self.threshold_pct / 2

    @property
    def idle_share(self) -> float:
        """The share of the time (NVML) or of the SMs' time (GPM) nothing ran, 0..1."""
        return min(1.0, max(0.0, 1 - self.value_pct / 100))


def busy_signal(summary: Summary) -> BusySignal | None:
    """SM activity where it was measured, else NVML utilisation, else None."""
    if summary.sm_active_median_pct is not None:
        return BusySignal(summary.sm_active_median_pct, SM_ACTIVE_BUSY_PCT, GPM)
    if summary.gpu_util_median_pct is not None:
        return BusySignal(summary.gpu_util_median_pct, GPU_BUSY_PCT, NVML)
    return None


def nvml_overstates(summary: Summary, signal: BusySignal | None) -> Finding | None:
    """When SM activity calls the GPU idle while NVML's utilisation calls it busy (small kernels
    keep NVML's reading high while most SMs are idle), that finding (None otherwise)."""
    util = summary.gpu_util_median_pct
    if signal is None or signal.source != GPM or signal.busy or util is None:
        return None
    if util < GPU_BUSY_PCT:
        return None
    return Finding("nvml-overstates", {"util_pct": util, "sm_active_pct": signal.value_pct})
