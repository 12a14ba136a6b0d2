"""Reading the sampler tables (host, GPU) over the steady window, with honest gaps.

Each reading is either a number or ``None`` with the reason it is missing: the sampler was not
running, the column was not reported, every value in the window was unavailable, or no sample
fell inside the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.capabilities import Capabilities

#: The capability that explains a missing column of each table.
GPU_COLUMN_CAPABILITY = {
    "util_gpu_pct": "gpu_utilisation",
    "mem_used_mb": "gpu_memory",
    "mem_total_mb": "gpu_memory",
    "torch_peak_mb": "gpu_memory",
    # the GPM columns (``sampling.gpm``); a run that never opened a GPU source has no GPM
    # capability: NVML's reason is theirs then
    "sm_active_pct": "gpm_sm_active",
    "sm_occupancy_pct": "gpm_sm_occupancy",
    "tensor_active_pct": "gpm_tensor_active",
    "dram_bw_pct": "gpm_dram_bw",
}
GPU_DEFAULT_CAPABILITY = "nvml"
HOST_CAPABILITY = "host"
#: Host columns with a capability of their own (while the host sampler itself ran).
HOST_COLUMN_CAPABILITY = {"steal_pct": "steal_time", "workers_cpu_wait_pct": "cpu_wait"}


@dataclass
class Reading:
    """A value from a sample table (``None`` = unavailable, ``why`` says why)."""

    value: float | None
    why: str = ""


class Window:
    """The rows of one sample table (its columns, as a record snapshot holds them) whose time
    lies inside ``[t0, t1]`` (seconds)."""

    def __init__(
        self,
        table: Mapping[str, Any] | None,
        t0: float,
        t1: float,
        capabilities: Capabilities,
        kind: str,
    ) -> None:
        self.kind = kind  # "host" or "gpu"
        self.capabilities = capabilities
        self.columns: dict[str, np.ndarray] = {}
        self.all_columns: dict[str, np.ndarray] = {}
        self.missing_table = table is None
        if table is None:
            return
        snap = table
        t = np.frombuffer(snap["t"], dtype="f8") if len(snap["t"]) else np.zeros(0)
        inside = (t >= t0) & (t <= t1)
        for name, col in snap.items():
            values = np.frombuffer(col, dtype="f8") if len(col) else np.zeros(0)
            self.all_columns[name] = values
            self.columns[name] = values[inside]

    def _capability(self, column: str) -> str:
        if self.kind == "host":
            own = HOST_COLUMN_CAPABILITY.get(column)
            if own is None or not self.capabilities.ok(HOST_CAPABILITY):
                return HOST_CAPABILITY
            return own
        name = GPU_COLUMN_CAPABILITY.get(column, GPU_DEFAULT_CAPABILITY)
        if name.startswith("gpm_") and name not in self.capabilities.available:
            return GPU_DEFAULT_CAPABILITY
        return name

    def _why_missing(self, column: str, whole_run: bool) -> str:
        why = self.capabilities.why(self._capability(column))
        if self.missing_table:
            return why or "no samples were taken in this run"
        if column not in self.columns:
            return why or f"{column} is not reported by this sampler"
        if not whole_run and not len(self.columns["t"]):
            return "no sample fell inside the steady steps: the run was too short for the sampler"
        return why or f"{column} was unavailable in every sample"

    def values(self, column: str, whole_run: bool = False) -> np.ndarray:
        """The finite values of ``column`` (inside the window, or over the whole run)."""
        source = self.all_columns if whole_run else self.columns
        col = source.get(column)
        if col is None:
            return np.zeros(0)
        return col[np.isfinite(col)]

    def _reduce(self, column: str, how: str, whole_run: bool) -> Reading:
        values = self.values(column, whole_run)
        if len(values):
            if how == "median":
                return Reading(float(np.median(values)))
            return Reading(float(values.mean() if how == "mean" else values.max()))
        return Reading(None, self._why_missing(column, whole_run))

    def median(self, column: str) -> Reading:
        """Median of ``column`` over the steady window."""
        return self._reduce(column, "median", whole_run=False)

    def median_beside(self, column: str, beside: str) -> Reading:
        """Median of ``column`` over the steady samples in which ``beside`` was read too: the
        worker processes alive beside their CPU, which is read only while some run (between
        epochs, without persistent workers, none do)."""
        col, other = self.columns.get(column), self.columns.get(beside)
        if col is None or other is None or not np.isfinite(other).any():
            return self.median(column)
        values = col[np.isfinite(col) & np.isfinite(other)]
        return Reading(float(np.median(values))) if len(values) else self.median(column)

    def mean(self, column: str) -> Reading:
        """Mean of ``column`` over the steady window (for a share of time, such as steal
        time, the mean is the share of the whole window)."""
        return self._reduce(column, "mean", whole_run=False)

    def peak(self, column: str) -> Reading:
        """Largest value of ``column`` over the whole run."""
        return self._reduce(column, "max", whole_run=True)
