"""A fake NVML module for tests: the pynvml function names the GPU source calls, the REAL
pynvml exception classes and constants, and per-field behaviour (a value, an error on every
call, or an error after N good calls — a GPU lost mid-run, a timeout for one tick).

Errors are raised exactly the way pynvml raises them: ``pynvml.NVMLError(code)``, which
``NVMLError.__new__`` turns into the matching subclass (``NVMLError_NotSupported``...).

::

    gpu = FakeGpu("GPU-1111...")
    gpu.set("power", error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpu.set("temperature", 65, fail_after=10)          # GPU lost after 10 good reads
    gpu.enable_gpm(sm_active=23.0)                     # a Hopper GPU: GPM metrics
    nvml = FakeNvml([gpu])

GPM goes through the real ctypes structures of pynvml (``c_nvmlGpmMetricsGet_t``, sample
handles of type ``c_nvmlGpmSample_t``), so a wrong field or type in the caller fails here too;
the fake checks that the two samples of a metric were taken, in order, on the same device.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeField:
    """How one NVML query behaves for one device.

    ``value``: what it returns (a callable is called on each read). ``error``: an NVML error
    code raised on every call. ``fail_after``: that many calls succeed, then ``fail_with`` is
    raised — on every later call, or for ``fail_for`` calls and then values again.
    """

    value: Any = None
    error: int | None = None
    fail_after: int | None = None
    fail_with: int = pynvml.NVML_ERROR_GPU_IS_LOST
    fail_for: int | None = None
    calls: int = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.error is not None:
            raise pynvml.NVMLError(self.error)
        if self.fail_after is not None and self.calls > self.fail_after:
            failing = self.calls - self.fail_after
            if self.fail_for is None or failing <= self.fail_for:
                raise pynvml.NVMLError(self.fail_with)
        return self.value() if callable(self.value) else self.value


class PcieCounter:
    """Cumulative PCIe byte counters that grow at a fixed rate, with NVML-style µs timestamps,
    ``bits`` wide (the H200's driver gives 32-bit ones, which wrap at 4 GiB)."""

    def __init__(
        self,
        rx_mib_s: float = 1000.0,
        tx_mib_s: float = 250.0,
        step_us: int = 100_000,
        bits: int = 64,
    ):
        self.rx_mib_s, self.tx_mib_s, self.step_us, self.bits = rx_mib_s, tx_mib_s, step_us, bits
        self.timestamp_us = 1_000_000_000
        self.rx = self.tx = 0

    def __call__(self) -> tuple[int, int, int]:
        self.timestamp_us += self.step_us
        self.rx += int(self.rx_mib_s * MIB * self.step_us / 1e6)
        self.tx += int(self.tx_mib_s * MIB * self.step_us / 1e6)
        wrap = 1 << self.bits
        return self.rx % wrap, self.tx % wrap, self.timestamp_us


class FakeGpu:
    """A physical GPU (or, with ``parent``, a MIG instance) and the values NVML gives for it."""

    def __init__(
        self,
        uuid: str,
        pci_bus_id: str = "00000000:01:00.0",
        name: str = "Fake GPU",
        *,
        mig_mode: int = 0,
        parent: FakeGpu | None = None,
        memory_total_mib: float = 16384.0,
    ) -> None:
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id
        self.name = name
        self.parent = parent
        self.mig_instances: list[FakeGpu] = []
        self.fields: dict[str, FakeField] = {
            "uuid": FakeField(uuid),
            "pci": FakeField(SimpleNamespace(busId=pci_bus_id.encode())),
            "name": FakeField(name),
            "compute_capability": FakeField((8, 0)),
            "mig_mode": FakeField([mig_mode, mig_mode]),
            "utilization": FakeField(SimpleNamespace(gpu=87, memory=41)),
            "memory": FakeField(
                SimpleNamespace(
                    total=int(memory_total_mib * MIB),
                    used=int(memory_total_mib / 4 * MIB),
                    free=int(memory_total_mib * 3 / 4 * MIB),
                )
            ),
            "power": FakeField(215_500),  # mW
            "power_limit": FakeField(300_000),  # mW
            "sm_clock": FakeField(1410),
            "max_sm_clock": FakeField(1980),
            "temperature": FakeField(64),
            "clock_events": FakeField(0x4),  # software power cap
            "throttle_reasons": FakeField(0x4),
            "pcie_counters": FakeField(PcieCounter()),
            "pcie_throughput": FakeField(lambda: (512_000, 128_000)),  # KiB/s
            # no GPM before Hopper (the default: an A100's compute capability)
            "gpm_support": FakeField(SimpleNamespace(version=1, isSupportedDevice=0)),
            "gpm_sample": FakeField(None),
            "gpm_metrics": FakeField(dict(GPM_HOPPER)),
        }
        if mig_mode:  # NVML reports no utilisation on a MIG-enabled GPU
            self.set("utilization", error=pynvml.NVML_ERROR_NOT_SUPPORTED)

    @property
    def is_mig(self) -> bool:
        return self.parent is not None

    def enable_gpm(self, **metrics: Any) -> FakeGpu:
        """A GPU with GPM (Hopper and later); ``metrics`` replace values of
        :data:`GPM_HOPPER` by key (``sm_active=23.0``), a ``(None, code)`` pair makes that
        metric fail with NVML error ``code``."""
        self.set("compute_capability", (9, 0))
        self.set("gpm_support", SimpleNamespace(version=1, isSupportedDevice=1))
        values = dict(GPM_HOPPER)
        for key, value in metrics.items():
            values[GPM_IDS[key]] = value
        self.set("gpm_metrics", values)
        return self

    def set(self, field: str, value: Any = None, **behaviour: Any) -> FakeGpu:
        """Replace a field's behaviour (see :class:`FakeField`); returns self for chaining."""
        if field not in self.fields:
            raise KeyError(f"unknown fake NVML field {field!r}: {sorted(self.fields)}")
        if value is None and "error" not in behaviour:
            value = self.fields[field].value
        self.fields[field] = FakeField(value, **behaviour)
        return self

    def add_mig(self, uuid: str, memory_total_mib: float = 4864.0) -> FakeGpu:
        inst = FakeGpu(
            uuid, self.pci_bus_id, self.name, parent=self, memory_total_mib=memory_total_mib
        )
        for field in ("utilization", "power", "power_limit", "sm_clock", "max_sm_clock", "temperature",
                      "clock_events", "throttle_reasons", "pcie_counters", "pcie_throughput"):  # fmt: skip
            inst.set(field, error=pynvml.NVML_ERROR_NOT_SUPPORTED)  # asked on the parent, as real
        self.mig_instances.append(inst)
        return inst


#: GPM metric ids (pynvml's constants) by the sampler's keys
GPM_IDS = {
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_bw": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}
#: What a busy, host-bound Hopper GPU's GPM metrics read (percent): few SMs busy
GPM_HOPPER = {
    GPM_IDS["sm_active"]: 23.0,
    GPM_IDS["sm_occupancy"]: 11.5,
    GPM_IDS["tensor_active"]: 4.0,
    GPM_IDS["dram_bw"]: 31.0,
}


class FakeNvml:
    """Stands in for the ``pynvml`` module.

    ``init_error``: NVML error code ``nvmlInit`` raises. ``missing``: function names this
    binding lacks (``AttributeError``, as with an old nvidia-ml-py). ``driver``: how
    ``nvmlSystemGetDriverVersion`` behaves (a :class:`FakeField`; a version by default).
    ``calls`` counts calls by function name; ``inits``/``shutdowns`` count the library's start
    and stop; ``gpm_samples_live`` the GPM sample buffers allocated and not freed.
    """

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        *,
        init_error: int | None = None,
        missing: Iterable[str] = (),
        driver: FakeField | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.missing = set(missing)
        self.driver = driver if driver is not None else FakeField("550.54.15")
        self.calls: Counter[str] = Counter()
        self.inits = 0
        self.shutdowns = 0
        self._lock = threading.Lock()
        #: address of each GPM sample buffer -> (its memory, the device and order of its sample)
        self._gpm: dict[int, list[Any]] = {}
        self._gpm_order = 0

    @property
    def gpm_samples_live(self) -> int:
        return len(self._gpm)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith(("nvml", "c_nvml")) and name in object.__getattribute__(self, "missing"):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        # constants and exception classes (NVML_*, NVMLError*) are pynvml's own
        if name.startswith("NVML"):
            return getattr(pynvml, name)
        raise AttributeError(f"fake NVML has no {name!r}")

    @property
    def initialised(self) -> bool:
        return self.inits > self.shutdowns

    def _call(self, name: str, handle: FakeGpu | None, field: str) -> Any:
        with self._lock:
            self.calls[name] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        assert isinstance(handle, FakeGpu), (
            f"{name} got a handle that is not a fake GPU: {handle!r}"
        )
        return handle.fields[field]()

    # --- library ------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls["nvmlSystemGetDriverVersion"] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.driver()

    # --- enumeration --------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return self._call("nvmlDeviceGetUUID", handle, "uuid")

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        return self._call("nvmlDeviceGetPciInfo", handle, "pci")

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._call("nvmlDeviceGetName", handle, "name")

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        return self._call("nvmlDeviceGetCudaComputeCapability", handle, "compute_capability")

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        return self._call("nvmlDeviceGetMigMode", handle, "mig_mode")

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self.calls["nvmlDeviceGetMaxMigDeviceCount"] += 1
        return 7 if handle.fields["mig_mode"].value[0] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeGpu:
        self.calls["nvmlDeviceGetMigDeviceHandleByIndex"] += 1
        if index >= len(handle.mig_instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle.mig_instances[index]

    # --- counters -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        return self._call("nvmlDeviceGetUtilizationRates", handle, "utilization")

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        return self._call("nvmlDeviceGetMemoryInfo", handle, "memory")

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._call("nvmlDeviceGetPowerUsage", handle, "power")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        return self._call("nvmlDeviceGetEnforcedPowerLimit", handle, "power_limit")

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._call("nvmlDeviceGetClockInfo", handle, "sm_clock")

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._call("nvmlDeviceGetMaxClockInfo", handle, "max_sm_clock")

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._call("nvmlDeviceGetTemperature", handle, "temperature")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return self._call("nvmlDeviceGetCurrentClocksEventReasons", handle, "clock_events")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", handle, "throttle_reasons")

    def nvmlDeviceGetPcieThroughput(self, handle: FakeGpu, counter: int) -> int:
        rx, tx = self._call("nvmlDeviceGetPcieThroughput", handle, "pcie_throughput")
        return rx if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES else tx

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list[int]) -> list[Any]:
        counter = handle.fields["pcie_counters"].value
        bits = getattr(counter, "bits", 64)
        rx, tx, stamp = self._call("nvmlDeviceGetFieldValues", handle, "pcie_counters")
        by_id = {
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: rx,
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: tx,
        }
        return [
            SimpleNamespace(
                fieldId=fid,
                nvmlReturn=pynvml.NVML_SUCCESS if fid in by_id else pynvml.NVML_ERROR_NOT_SUPPORTED,
                valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                if bits == 32
                else pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                value=SimpleNamespace(ullVal=by_id.get(fid, 0), uiVal=by_id.get(fid, 0)),
                timestamp=stamp,
            )
            for fid in field_ids
        ]

    # --- GPM -------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: FakeGpu) -> Any:
        return self._call("nvmlGpmQueryDeviceSupport", handle, "gpm_support")

    def nvmlGpmSampleAlloc(self) -> Any:
        self.calls["nvmlGpmSampleAlloc"] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        memory = ctypes.create_string_buffer(16)
        sample = ctypes.cast(memory, pynvml.c_nvmlGpmSample_t)
        self._gpm[_address(sample)] = [memory, None, 0]
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.calls["nvmlGpmSampleFree"] += 1
        assert self._gpm.pop(_address(sample), None) is not None, "freed a sample never allocated"

    def nvmlGpmSampleGet(self, handle: FakeGpu, sample: Any) -> Any:
        entry = self._gpm.get(_address(sample))
        assert entry is not None, "nvmlGpmSampleGet on a sample not allocated (or freed)"
        self._call("nvmlGpmSampleGet", handle, "gpm_sample")
        self._gpm_order += 1
        entry[1], entry[2] = handle, self._gpm_order
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self.calls["nvmlGpmMetricsGet"] += 1
        assert isinstance(request, pynvml.c_nvmlGpmMetricsGet_t)
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        first = self._gpm.get(_address(request.sample1))
        second = self._gpm.get(_address(request.sample2))
        assert first is not None and second is not None, "a metric of samples not allocated"
        assert first[1] is not None and first[1] is second[1], "samples of one device"
        assert first[2] < second[2], "sample1 must be taken before sample2"
        gpu = first[1]
        values = gpu.fields["gpm_metrics"]()
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            value = values.get(metric.metricId, (None, pynvml.NVML_ERROR_NOT_SUPPORTED))
            if isinstance(value, tuple):
                metric.nvmlReturn, metric.value = value[1], 0.0
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, float(value)
        return request


def make_gpus(count: int, *, mig_on: Iterable[int] = ()) -> list[FakeGpu]:
    """``count`` fake GPUs with distinct UUIDs (``GPU-<i>…``) and PCI bus ids (``0x10·(i+1)``)."""
    mig = set(mig_on)
    return [
        FakeGpu(
            f"GPU-{i:x}{i:x}{i:x}{i:x}aaaa-0000-1111-2222-33334444555{i:x}",
            f"00000000:{16 * (i + 1):02X}:00.0",
            f"Fake GPU {i}",
            mig_mode=1 if i in mig else 0,
        )
        for i in range(count)
    ]


def _address(sample: Any) -> int:
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)
