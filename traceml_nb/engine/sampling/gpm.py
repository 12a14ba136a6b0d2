"""SM activity and its companions from NVML's GPM metrics (GPU Performance Monitoring; Hopper
and later GPUs, an R525 or later driver, a recent nvidia-ml-py).

NVML's "GPU utilisation" (``util_gpu_pct``) is the share of time *some* kernel ran: one small
kernel keeps it at 100% while most SMs are idle. GPM counts what the SMs did. Columns of the
GPU table (percent 0..100 over the time since the previous GPM read; NaN = unavailable):

===================== ===========================================================
``sm_active_pct``     SM activity: the share of the SMs that were busy (a warp
                      resident), averaged over the period (``NVML_GPM_METRIC_SM_UTIL``)
``sm_occupancy_pct``  resident warps as a share of the SMs' maximum
``tensor_active_pct`` share of the time the SMs ran tensor-core instructions (any type)
``dram_bw_pct``       DRAM bandwidth used, as a share of its maximum
===================== ===========================================================

A metric is computed from two samples of the counters, which NVML asks to be more than
100 ms apart: they are read every :data:`GPM_PERIOD_S`, a tenth of the default sampling rate,
and the rows between have no GPM value. Where GPM is missing (a T4 or an A100, a driver or a
binding without GPM, a MIG instance) the columns are unavailable with the reason, in the
run's capabilities :data:`GPM_CAPABILITY` and :data:`COLUMN_CAPABILITY`; a metric the GPU
does not give is unavailable alone. A failure of GPM never costs the other GPU columns: only
a lost GPU (which drops the whole source) is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..capabilities import Capabilities
from . import nvml_binding as nb
from .collector import SourceLost

#: GPU table column -> the GPM metric it holds (a key of ``nvml_binding.GPM_METRIC_IDS``).
GPM_COLUMNS = {
    "sm_active_pct": "sm_active",
    "sm_occupancy_pct": "sm_occupancy",
    "tensor_active_pct": "tensor_active",
    "dram_bw_pct": "dram_bw",
}
#: Seconds between two GPM reads (each one sample of the counters and the metrics since the
#: previous sample).
GPM_PERIOD_S = 1.0
#: GPM reads in a row failing with an unexplained NVML error before GPM is given up for the run.
GPM_FLAKY_READS = 3
#: The capability that says whether any GPM metric is read, and why not.
GPM_CAPABILITY = "gpm"
#: The capability of each GPM column.
COLUMN_CAPABILITY = {column: f"gpm_{metric}" for column, metric in GPM_COLUMNS.items()}


class GpmReader:
    """GPM metrics of one device. ``why`` says why none is read ('' while they are);
    ``unsupported`` maps a column to why that metric alone is missing.

    Opened on the caller's thread (one first sample), read on the collector's: :meth:`read`
    gives every column, a value when a period has passed and the metric was computed, else
    None.
    """

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        capabilities: Capabilities,
        name: str,
        *,
        why: str = "",
        period_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self._capabilities = capabilities
        self._name = name
        self.why = why
        self.period_s = GPM_PERIOD_S if period_s is None else period_s
        self._clock = clock
        self.unsupported: dict[str, str] = {}
        self._samples: list[Any] = []
        self._previous = -1  #: index in ``_samples`` of the last sample taken, -1: none yet
        self._last_read = -float("inf")
        self._flaky = 0
        self._ids = [nb.gpm_metric_id(nvml, metric) for metric in GPM_COLUMNS.values()]
        if not why:
            self._open()

    def _open(self) -> None:
        nvml = self._nvml
        try:
            self.why = nb.gpm_unsupported_reason(nvml, self._handle)
            if self.why:
                return
            self._samples = [nb.gpm_sample_alloc(nvml) for _ in range(2)]
            self._sample(0)
            self._last_read = self._clock()  # the first metrics a period from now
        except Exception as exc:
            if nb.is_nvml_error(nvml, exc) and nb.classify(exc) == nb.LOST:
                self.close()
                raise SourceLost(f"{nb.error_text(exc)} (opening GPM)") from None
            if isinstance(exc, SourceLost):
                self.close()
                raise
            if self._samples and nb.is_nvml_error(nvml, exc) and nb.classify(exc) == nb.TRANSIENT:
                return  # no first sample yet: the first read takes it
            self._give_up(self._reason(exc))

    @property
    def reading(self) -> bool:
        return not self.why

    def read(self) -> dict[str, float | None]:
        """The GPM columns: values when a period has passed since the last read, else None."""
        values: dict[str, float | None] = dict.fromkeys(GPM_COLUMNS)
        if self.why:
            return values
        now = self._clock()
        if now - self._last_read < 0.9 * self.period_s:  # (less 10% for the ticks' jitter)
            return values
        self._last_read = now
        try:
            previous = self._previous
            current = 1 - previous if previous >= 0 else 0
            self._sample(current)
            if previous < 0:
                return values  # the first sample: a metric needs two
            results = nb.gpm_metrics(
                self._nvml, self._samples[previous], self._samples[current], self._ids
            )
        except SourceLost:
            raise
        except Exception as exc:
            if nb.is_nvml_error(self._nvml, exc) and nb.classify(exc) == nb.TRANSIENT:
                return values
            if nb.is_nvml_error(self._nvml, exc) and nb.classify(exc) == nb.FLAKY:
                self._flaky += 1
                if self._flaky < GPM_FLAKY_READS:
                    return values
                self._give_up(f"{nb.error_text(exc)} in {self._flaky} GPM reads in a row")
                return values
            self._give_up(self._reason(exc))
            return values
        self._flaky = 0
        for (column, _metric), (value, code) in zip(GPM_COLUMNS.items(), results, strict=True):
            if column in self.unsupported:
                continue
            if code == 0:
                values[column] = value
            elif nb.classify_code(code) == nb.UNSUPPORTED:
                self._column_unsupported(column, nb.code_text(self._nvml, code))
        return values

    def _sample(self, index: int) -> None:
        """Read the counters into sample ``index``; a lost GPU raises :class:`SourceLost`."""
        try:
            nb.gpm_sample(self._nvml, self._handle, self._samples[index])
        except Exception as exc:
            if nb.is_nvml_error(self._nvml, exc) and nb.classify(exc) == nb.LOST:
                raise SourceLost(f"{nb.error_text(exc)} (reading GPM)") from None
            raise
        self._previous = index

    def _reason(self, exc: BaseException) -> str:
        if nb.is_nvml_error(self._nvml, exc):
            return f"GPM could not be read ({nb.error_text(exc)})"
        return f"GPM could not be read ({type(exc).__name__}: {exc})"

    def _column_unsupported(self, column: str, why: str) -> None:
        text = f"{self._name}: this GPU does not give the GPM metric {column} ({why})"
        self.unsupported[column] = text
        self._capabilities.set(COLUMN_CAPABILITY[column], False, text)

    def _give_up(self, why: str) -> None:
        """No GPM metric for the rest of the run."""
        found_mid_run = self._previous >= 0
        self.why = why
        self.close()
        if found_mid_run:
            text = f"{self._name}: GPM metrics unavailable from now on: {why}"
            self._capabilities.note(text)
            self._capabilities.set(GPM_CAPABILITY, False, text)
            for column in GPM_COLUMNS:
                self._capabilities.set(COLUMN_CAPABILITY[column], False, text)

    def close(self) -> None:
        """Free the sample buffers (before NVML shuts down)."""
        samples, self._samples = self._samples, []
        for sample in samples:
            try:
                nb.gpm_sample_free(self._nvml, sample)
            except Exception:
                pass


def set_gpm_capabilities(capabilities: Capabilities, readers: list[GpmReader], why: str) -> None:
    """The run's GPM capabilities once its sources are open: available where a source reads
    GPM; else why not (``why``: the reason when no source has NVML at all)."""
    reading = [r for r in readers if r.reading]
    if reading:
        capabilities.set(GPM_CAPABILITY, True)
        for name in COLUMN_CAPABILITY.values():
            capabilities.set(name, True)
        return
    reasons = sorted({r.why for r in readers if r.why})
    text = "; ".join(reasons) or why or "GPM metrics are not read"
    capabilities.set(GPM_CAPABILITY, False, text)
    for name in COLUMN_CAPABILITY.values():
        capabilities.set(name, False, text)
