"""The GPU sample source: NVML counters and the PyTorch allocator for one CUDA device.

Layers, as in nvitop: :mod:`.nvml_binding` calls NVML and converts units; :mod:`.gpu_devices`
says which NVML device a CUDA index is; :mod:`.gpm` reads the GPM metrics; :mod:`.gpu_open` opens
the sources of a run; this module decides what each failure means for a sample (the error
policy) and what the run's capabilities say.

Columns of the table (``None``/NaN = unavailable, never 0):

=================== ===============================================================
``util_gpu_pct``    % of the last NVML sample period in which a kernel was running
``util_mem_pct``    % of the last NVML sample period in which device memory was read/written
``mem_used_mb``     device memory in use, all processes (MiB)
``mem_total_mb``    device memory (MiB; a MIG instance's own share on MIG)
``power_w``         board power draw (W)
``power_limit_w``   power limit the driver enforces (W)
``sm_clock_mhz``    current SM clock (MHz)
``sm_clock_max_mhz`` maximum SM clock (MHz)
``temp_c``          GPU temperature (°C)
``pcie_rx_mbps``    PCIe traffic into the GPU (MiB/s), averaged since the previous PCIe read
``pcie_tx_mbps``    PCIe traffic out of the GPU (MiB/s)
``throttle_reasons`` NVML clock-event reason bits (see :func:`describe_clock_events`)
``sm_active_pct``   GPM SM activity, ``sm_occupancy_pct``, ``tensor_active_pct``,
``dram_bw_pct``     ...: percent over the last GPM period (:mod:`.gpm`; Hopper and later)
``torch_alloc_mb``  memory held by tensors of this process (MiB, ``memory_allocated``)
``torch_reserved_mb`` memory the caching allocator holds (MiB, ``memory_reserved``)
``torch_peak_mb``   peak of ``torch_alloc_mb`` since the last reset (``max_memory_allocated``)
=================== ===============================================================

How often each is read, to keep the sampler within 1% of a core: utilisation, memory used, the
SM clock and the clock-event reasons at every tick (the throttling rule aligns the last two
with the steps); power draw and temperature every :data:`SLOW_FIELDS_PERIOD_S` (NVML averages
power over about a second itself, and a temperature moves in seconds); PCIe every
:data:`PCIE_COUNTER_PERIOD_S` (32-bit counters) or :data:`PCIE_COUNTER_WIDE_PERIOD_S`; the GPM
metrics every :data:`~.gpm.GPM_PERIOD_S`; memory total, power limit and maximum SM clock once,
when the source opens. A row between two reads of a field has no value for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..capabilities import Capabilities
from ..contracts import CLOCK_EVENT_REASONS
from ..record import SampleTable
from . import nvml_binding as nb
from .collector import SourceLost
from .gpm import GPM_COLUMNS, GpmReader
from .gpu_devices import (
    AllocatorReader,
    NvmlDevice,
)

COLUMNS = (
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_mb",
    "mem_total_mb",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "temp_c",
    "pcie_rx_mbps",
    "pcie_tx_mbps",
    "throttle_reasons",
    *GPM_COLUMNS,
    "torch_alloc_mb",
    "torch_reserved_mb",
    "torch_peak_mb",
)

#: Ticks in a row with an unexplained NVML error ("Unknown Error") before the GPU counts as lost.
FLAKY_TICKS_LOST = 3
#: ``nvmlDeviceGetPcieThroughput`` blocks ~20 ms per direction, so where the cheap byte
#: counters are missing it is read at most this often (s); the ticks between have no value.
PCIE_THROUGHPUT_PERIOD_S = 1.0
#: NVML's PCIe byte counters are the sampler's most expensive read, so they are read at most this
#: often (s) where they are 32-bit; the ticks between have no PCIe value. More than 4 GiB between
#: two reads (20 GiB/s at this period) wraps more than once and is undercounted.
PCIE_COUNTER_PERIOD_S = 0.2
#: ...and at most this often (s) where they are 64-bit: they cannot wrap, and the rate is the
#: average since the previous read either way.
PCIE_COUNTER_WIDE_PERIOD_S = 1.0
#: Power draw and temperature are read at most this often (s): NVML's power reading is itself an
#: average over about a second on recent GPUs, and a GPU's temperature changes over seconds.
SLOW_FIELDS_PERIOD_S = 1.0
#: Why a MIG device (an instance, or a GPU in MIG mode) has no GPM columns.
GPM_ON_MIG = "MIG mode is enabled: GPM metrics are not read on MIG devices"


def describe_clock_events(mask: float | int | None) -> list[str]:
    """The names of the clock-event (throttle) reasons set in an NVML bit mask."""
    if mask is None or mask != mask:  # None or NaN
        return []
    bits = int(mask)
    names = [label for bit, label in CLOCK_EVENT_REASONS.items() if bits & bit]
    unknown = bits & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"other (0x{unknown:x})")
    return names


# --- the source -------------------------------------------------------------------------------


class NvmlSession:
    """One ``nvmlInit`` shared by the sources of a run; ``nvmlShutdown`` when the last closes."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._users = 1  # the opener's reference, released when it has opened the sources
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or self._closed:
                return
            self._closed = True
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass  # a lost GPU or a dead driver: nothing left to shut down


@dataclass
class _Group:
    """Columns that one NVML call fills."""

    key: str
    columns: tuple[str, ...]
    read: Callable[[], tuple[float | None, ...]]
    slow: bool = False  #: read every ``GpuSource.slow_fields_period_s``, not every tick
    last_read: float = -float("inf")


class GpuSource:
    """Samples one CUDA device: NVML counters (when NVML works) and PyTorch's allocator.

    ``read`` never raises for a missing value: an unsupported counter is ``None`` (and not asked
    again), a timeout is ``None`` for that tick; a lost GPU or a dead NVML raises
    :class:`SourceLost`, on which the collector drops the source.
    """

    def __init__(
        self,
        cuda_index: int,
        capabilities: Capabilities,
        *,
        session: NvmlSession | None = None,
        device: NvmlDevice | None = None,
        handle: Any = None,
        parent_handle: Any = None,
        allocator: AllocatorReader | None = None,
        pcie_throughput_period_s: float = PCIE_THROUGHPUT_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cuda_index = cuda_index
        self.device = device
        self.name = f"GPU cuda:{cuda_index}" + (f" = NVML {device.label}" if device else "")
        self.table = SampleTable(COLUMNS)
        self.capabilities = capabilities
        self.unsupported: dict[str, str] = {}  #: group key -> why NVML cannot give it
        self.static: dict[str, float | None] = {
            "mem_total_mb": None,
            "power_limit_w": None,
            "sm_clock_max_mhz": None,
        }
        self._session = session
        self._nvml = session.nvml if session is not None else None
        self._allocator = allocator
        self._groups: list[_Group] = []
        self._flaky_ticks = 0
        self._closed = False
        self._clock = clock
        self._pcie_period = pcie_throughput_period_s
        self.pcie_counter_period_s = PCIE_COUNTER_PERIOD_S
        self._pcie_last_read = -float("inf")
        self._pcie_prev: nb.PcieCounters | None = None
        self.pcie_method = ""  #: "byte counters", "throughput" or "" (none)
        self.slow_fields_period_s = SLOW_FIELDS_PERIOD_S
        self._gpm: GpmReader | None = None
        self._probing = False
        if session is not None:
            session.acquire()
            try:
                self._open_nvml(handle, parent_handle if parent_handle is not None else handle)
            except BaseException:
                self.close()
                raise

    # --- opening --------------------------------------------------------------------------
    def _open_nvml(self, handle: Any, parent: Any) -> None:
        nvml = self._nvml
        dev = self.device
        if dev is not None and (dev.is_mig or dev.mig_enabled):
            where = "this MIG instance" if dev.is_mig else f"{dev.label}"
            self.unsupported["utilisation"] = (
                f"MIG mode is enabled on {where}: NVML does not report utilisation for MIG devices"
            )
        self._groups = [
            _Group(
                "utilisation",
                ("util_gpu_pct", "util_mem_pct"),
                lambda: nb.utilisation(nvml, handle),
            ),
            _Group("memory", ("mem_used_mb",), lambda: (nb.memory_mib(nvml, handle)[0],)),
            _Group("power", ("power_w",), lambda: (nb.power_w(nvml, parent),), slow=True),
            _Group("sm_clock", ("sm_clock_mhz",), lambda: (nb.sm_clock_mhz(nvml, parent),)),
            _Group(
                "temperature", ("temp_c",), lambda: (nb.temperature_c(nvml, parent),), slow=True
            ),
            _Group("pcie", ("pcie_rx_mbps", "pcie_tx_mbps"), lambda: self._read_pcie(parent)),
            _Group(
                "clock_events",
                ("throttle_reasons",),
                lambda: (float(nb.clock_event_reasons(nvml, parent)),),
            ),
        ]
        self.static["mem_total_mb"] = self._read_static(
            "memory total", lambda: nb.memory_mib(nvml, handle)[1]
        )
        self.static["power_limit_w"] = self._read_static(
            "power limit", lambda: nb.power_limit_w(nvml, parent)
        )
        self.static["sm_clock_max_mhz"] = self._read_static(
            "max SM clock", lambda: nb.sm_clock_max_mhz(nvml, parent)
        )
        self._choose_pcie_method(parent)
        mig = dev is not None and (dev.is_mig or dev.mig_enabled)
        self._gpm = GpmReader(
            nvml, parent, self.capabilities, self.name, why=GPM_ON_MIG if mig else "",
            clock=self._clock,
        )  # fmt: skip
        self._probing = True
        try:
            self._read_nvml()  # a probe: learns what is unsupported before the thread starts
        finally:
            self._probing = False

    def _read_static(self, what: str, read: Callable[[], float]) -> float | None:
        try:
            return float(read())
        except Exception as exc:
            if not nb.is_nvml_error(self._nvml, exc):
                raise
            if nb.classify(exc) == nb.LOST:
                raise SourceLost(f"{nb.error_text(exc)} while reading the {what}") from None
            return None

    def _choose_pcie_method(self, parent: Any) -> None:
        nvml = self._nvml
        try:
            self._pcie_prev = nb.pcie_byte_counters(nvml, parent)
            self.pcie_method = "byte counters"
            if self._pcie_prev.bits > 32:
                self.pcie_counter_period_s = PCIE_COUNTER_WIDE_PERIOD_S
            return
        except Exception as exc:
            if not nb.is_nvml_error(nvml, exc) and not isinstance(exc, AttributeError):
                raise
            if nb.is_nvml_error(nvml, exc) and nb.classify(exc) == nb.LOST:
                raise SourceLost(f"{nb.error_text(exc)} while reading PCIe counters") from None
        if hasattr(nvml, "nvmlDeviceGetPcieThroughput"):
            self.pcie_method = "throughput"
        else:
            self.unsupported["pcie"] = "this NVML binding has no PCIe throughput"

    def _pcie_due(self, period: float) -> bool:
        """Whether ``period`` seconds (less 10% for jitter) have passed since the last read."""
        now = self._clock()
        if now - self._pcie_last_read < 0.9 * period:
            return False
        self._pcie_last_read = now
        return True

    def _read_pcie(self, parent: Any) -> tuple[float | None, float | None]:
        if self.pcie_method == "byte counters":
            if not self._pcie_due(self.pcie_counter_period_s):
                return None, None
            now = nb.pcie_byte_counters(self._nvml, parent)
            prev, self._pcie_prev = self._pcie_prev, now
            if prev is None or now.timestamp_us <= prev.timestamp_us:
                return None, None  # first reading, or NVML has not refreshed the counters
            seconds = (now.timestamp_us - prev.timestamp_us) / 1e6
            wrap = 1 << now.bits  # the counters wrap (at 4 GiB where they are 32-bit)
            rx = (now.rx_bytes - prev.rx_bytes) % wrap
            tx = (now.tx_bytes - prev.tx_bytes) % wrap
            return rx / nb.MIB / seconds, tx / nb.MIB / seconds
        if self._probing or not self._pcie_due(self._pcie_period):
            return None, None  # (the probe at open runs on the caller's thread: not 40 ms there)
        return nb.pcie_throughput_mib_s(self._nvml, parent)

    # --- sampling -------------------------------------------------------------------------
    def _read_nvml(self) -> dict[str, float | None]:
        values: dict[str, float | None] = dict(self.static)
        flaky: list[str] = []
        now = self._clock()
        for group in self._groups:
            if group.key in self.unsupported:
                continue
            if group.slow and not self._probing:  # (the probe's reading is not a row)
                if now - group.last_read < 0.9 * self.slow_fields_period_s:  # less 10% jitter
                    continue
                group.last_read = now
            try:
                read = group.read()
            except Exception as exc:
                if not nb.is_nvml_error(self._nvml, exc):
                    raise
                kind = nb.classify(exc)
                if kind == nb.LOST:
                    raise SourceLost(f"{nb.error_text(exc)} (reading {group.key})") from None
                if kind == nb.UNSUPPORTED:
                    self._mark_unsupported(group, nb.error_text(exc))
                elif kind == nb.FLAKY:
                    flaky.append(f"{group.key}: {nb.error_text(exc)}")
                continue  # TRANSIENT and FLAKY: no value this tick
            for column, value in zip(group.columns, read, strict=True):
                values[column] = value
        if flaky:
            self._flaky_ticks += 1
            if self._flaky_ticks >= FLAKY_TICKS_LOST:
                raise SourceLost(
                    f"NVML failed {self._flaky_ticks} samples in a row ({'; '.join(flaky)})"
                )
        else:
            self._flaky_ticks = 0
        if self._gpm is not None and not self._probing:  # (it took its first sample at open)
            values.update(self._gpm.read())
        return values

    def _mark_unsupported(self, group: _Group, why: str) -> None:
        self.unsupported[group.key] = why
        if len(self.table):  # found mid-run: say so (found by the probe at open: summarised)
            cols = ", ".join(group.columns)
            self.capabilities.note(
                f"{self.name}: {cols} unavailable from sample {len(self.table)} on ({why})"
            )

    def read(self) -> dict[str, float | int | None]:
        """One sample (called on the collector thread)."""
        if self._closed:
            raise SourceLost("source closed")
        values: dict[str, float | int | None] = dict.fromkeys(COLUMNS)
        if self._nvml is not None:
            values.update(self._read_nvml())
        if self._allocator is not None:
            try:
                alloc, reserved, peak = self._allocator()
            except Exception as exc:
                self._allocator = None
                self.capabilities.note(
                    f"{self.name}: PyTorch allocator counters stopped ({type(exc).__name__}: {exc})"
                )
            else:
                values.update(torch_alloc_mb=alloc, torch_reserved_mb=reserved, torch_peak_mb=peak)
        return values

    # --- what it can do ---------------------------------------------------------------------
    @property
    def has_nvml(self) -> bool:
        return self._nvml is not None

    @property
    def has_utilisation(self) -> bool:
        return self.has_nvml and "utilisation" not in self.unsupported

    @property
    def has_gpm(self) -> bool:
        return self._gpm is not None and self._gpm.reading

    @property
    def has_memory(self) -> bool:
        return (self.has_nvml and "memory" not in self.unsupported) or self._allocator is not None

    def unsupported_summary(self) -> str:
        """One line naming the columns NVML does not give for this device, '' when none."""
        if self._nvml is None:
            return ""
        parts = []
        for group in self._groups:
            if group.key in self.unsupported:
                parts.append(f"{', '.join(group.columns)} ({self.unsupported[group.key]})")
        for column, value in self.static.items():
            if value is None:
                parts.append(f"{column} (not reported)")
        return f"{self.name}: unavailable: " + "; ".join(parts) if parts else ""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._gpm is not None:
            self._gpm.close()  # before NVML shuts down
        if self._session is not None:
            self._session.release()
