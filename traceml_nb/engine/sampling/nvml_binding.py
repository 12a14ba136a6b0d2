"""A thin layer over ``pynvml`` (nvidia-ml-py): load it, classify its errors, read values in
the units the record uses.

Everything here takes the NVML module as an argument, so tests inject a fake with the same
function names that raises the real ``pynvml`` exception classes. The error policy (what a
failure means for a sample) lives in :mod:`traceml_nb.engine.sampling.gpu`; this module only says
*which kind* of failure an exception is.

Units: memory in MiB (2**20 bytes, as nvidia-smi shows "MiB"), power in W, clocks in MHz,
temperature in °C, PCIe throughput in MiB/s.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

MIB = 1024 * 1024

# NVML return codes (nvml.h; a stable C ABI, the same numbers pynvml maps to its classes).
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
NO_DATA = 21
NOT_READY = 27
GPU_NOT_FOUND = 28
UNKNOWN = 999

# What a failed read means for the sampler.
UNSUPPORTED = "unsupported"  #: this device/driver will never answer: stop asking
TRANSIENT = "transient"  #: no value this tick, ask again next tick
LOST = "lost"  #: the device or the library is gone: drop the source
FLAKY = "flaky"  #: unknown failure: tolerated a few ticks in a row, then treated as lost

_KIND_BY_CODE = {
    NOT_SUPPORTED: UNSUPPORTED,
    FUNCTION_NOT_FOUND: UNSUPPORTED,
    NO_PERMISSION: UNSUPPORTED,
    INVALID_ARGUMENT: UNSUPPORTED,
    NOT_FOUND: UNSUPPORTED,
    TIMEOUT: TRANSIENT,
    NO_DATA: TRANSIENT,
    NOT_READY: TRANSIENT,
    GPU_IS_LOST: LOST,
    UNINITIALIZED: LOST,
    RESET_REQUIRED: LOST,
    DRIVER_NOT_LOADED: LOST,
    GPU_NOT_FOUND: LOST,
}

_INIT_REASONS = {
    LIBRARY_NOT_FOUND: (
        "the NVIDIA driver library, libnvidia-ml, was not found: no NVIDIA driver on this machine"
    ),
    DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded: no NVIDIA GPU, or the driver is not running",
    NO_PERMISSION: "no permission to query the NVIDIA driver, NVML: Insufficient Permissions",
    LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the NVIDIA kernel driver have different versions: "
        "a driver update needs a reboot or a module reload"
    ),
    GPU_IS_LOST: "the GPU has fallen off the bus, NVML: GPU is lost",
}


def load_nvml() -> Any:
    """The ``pynvml`` module; raises ImportError when nvidia-ml-py is not installed."""
    import pynvml

    return pynvml


def start_nvml(nvml: Any = None) -> tuple[Any, str]:
    """``(nvml module, '')`` after a successful ``nvmlInit`` (``nvml`` injects one, tests),
    or ``(None, reason)``: the library is missing or does not start (:func:`init_failure_reason`).
    Whoever gets a module calls ``nvmlShutdown`` when done (NVML counts its inits)."""
    try:
        module = load_nvml() if nvml is None else nvml
    except ImportError as exc:
        return None, init_failure_reason(exc)
    try:
        module.nvmlInit()
    except Exception as exc:
        return None, init_failure_reason(exc)
    return module, ""


def shutdown(nvml: Any) -> None:
    """``nvmlShutdown``, whatever it raises (a lost GPU or a dead driver: nothing to shut)."""
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def error_code(exc: BaseException) -> int | None:
    """The NVML return code carried by a pynvml exception, None for anything else."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_nvml_error(nvml: Any, exc: BaseException) -> bool:
    base = getattr(nvml, "NVMLError", None)
    return isinstance(base, type) and isinstance(exc, base)


def classify(exc: BaseException) -> str:
    """``UNSUPPORTED``, ``TRANSIENT``, ``LOST`` or ``FLAKY`` for an NVML exception."""
    code = error_code(exc)
    if code is None:
        return FLAKY
    return classify_code(code)


def classify_code(code: int) -> str:
    """:func:`classify` for a bare NVML return code (a field's or a GPM metric's own)."""
    return _KIND_BY_CODE.get(code, FLAKY)


def code_text(nvml: Any, code: int) -> str:
    """:func:`error_text` for a bare NVML return code."""
    try:
        return error_text(nvml.NVMLError(code))
    except Exception:
        return f"NVML: error code {code}"


def error_text(exc: BaseException) -> str:
    """A one-line description such as ``'NVML: Not Supported'``."""
    try:
        text = str(exc).strip()
    except Exception:
        text = ""
    if not text:
        code = error_code(exc)
        text = f"error code {code}" if code is not None else type(exc).__name__
    return f"NVML: {text.splitlines()[0]}"


def init_failure_reason(exc: BaseException) -> str:
    """Why NVML could not start, in words a user can act on (one line, no traceback)."""
    if isinstance(exc, ImportError):
        return "nvidia-ml-py, the pynvml module, is not installed, so GPU counters cannot be read"
    code = error_code(exc)
    if code in _INIT_REASONS:
        return _INIT_REASONS[code]
    if code is not None:
        return f"NVML failed to start, {error_text(exc)}"
    message = str(exc).splitlines()[0] if str(exc) else ""
    return f"NVML failed to start, {type(exc).__name__}: {message}"


def text(value: Any) -> str:
    """An NVML string (pynvml returns ``str`` or, in older versions, ``bytes``)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


# --- reads in domain units ------------------------------------------------------------------


def uuid(nvml: Any, handle: Any) -> str:
    """The device's UUID as NVML writes it: ``GPU-…`` for a GPU, ``MIG-…`` for a MIG instance."""
    return text(nvml.nvmlDeviceGetUUID(handle))


def pci_bus_id(nvml: Any, handle: Any) -> str:
    """The PCI bus id as NVML writes it, e.g. ``00000000:01:00.0``."""
    return text(nvml.nvmlDeviceGetPciInfo(handle).busId)


def name(nvml: Any, handle: Any) -> str:
    return text(nvml.nvmlDeviceGetName(handle))


def driver_version(nvml: Any) -> str:
    """The NVIDIA driver's version, e.g. ``550.54.15``."""
    return text(nvml.nvmlSystemGetDriverVersion())


def cuda_compute_capability(nvml: Any, handle: Any) -> str:
    """The device's CUDA compute capability as ``major.minor``, e.g. ``7.5`` (a T4)."""
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    return f"{int(major)}.{int(minor)}"


def mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether MIG mode is currently on for a physical GPU (False where MIG does not exist)."""
    getter = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if getter is None:
        return False
    try:
        current, _pending = getter(handle)
    except Exception as exc:
        if is_nvml_error(nvml, exc) and classify(exc) == UNSUPPORTED:
            return False
        raise
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def mig_handles(nvml: Any, handle: Any) -> list[tuple[int, Any]]:
    """``(mig_index, handle)`` of the MIG instances that exist on a MIG-enabled GPU."""
    found = []
    count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    for index in range(count):
        try:
            found.append((index, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)))
        except Exception as exc:
            if is_nvml_error(nvml, exc) and classify(exc) in (UNSUPPORTED, TRANSIENT):
                continue  # this slot holds no instance
            raise
    return found


def utilisation(nvml: Any, handle: Any) -> tuple[float, float]:
    """``(gpu %, memory %)``: share of the last sample period a kernel ran / memory was busy."""
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    return float(rates.gpu), float(rates.memory)


def memory_mib(nvml: Any, handle: Any) -> tuple[float, float]:
    """``(used, total)`` device memory in MiB."""
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return info.used / MIB, info.total / MIB


def power_w(nvml: Any, handle: Any) -> float:
    """Board power draw in W."""
    return nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0


def power_limit_w(nvml: Any, handle: Any) -> float:
    """The power limit the driver enforces, in W."""
    return nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0


def sm_clock_mhz(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))


def sm_clock_max_mhz(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))


def temperature_c(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))


def clock_event_reasons(nvml: Any, handle: Any) -> int:
    """Why clocks are held below their maximum, as NVML's bit mask (``nvmlClocksEventReason*``).

    Uses ``nvmlDeviceGetCurrentClocksEventReasons`` where the binding and the driver have it,
    else the older ``nvmlDeviceGetCurrentClocksThrottleReasons`` (same bits).
    """
    getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if getter is not None:
        try:
            return int(getter(handle))
        except Exception as exc:
            if error_code(exc) != FUNCTION_NOT_FOUND:
                raise
    return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def pcie_throughput_mib_s(nvml: Any, handle: Any) -> tuple[float, float]:
    """``(rx, tx)`` PCIe throughput in MiB/s over NVML's own ~20 ms window (it blocks that long)."""
    rx_kib = nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
    tx_kib = nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
    return rx_kib / 1024.0, tx_kib / 1024.0


class PcieCounters(NamedTuple):
    """NVML's cumulative PCIe byte counters; they wrap around at ``2**bits``."""

    rx_bytes: int  #: into the GPU
    tx_bytes: int  #: out of the GPU
    timestamp_us: int  #: when NVML read them (µs)
    bits: int  #: counter width: 32 where NVML types them as unsigned int


def pcie_byte_counters(nvml: Any, handle: Any) -> PcieCounters:
    """NVML's PCIe byte counters (``NVML_FI_DEV_PCIE_COUNT_RX/TX_BYTES``).

    No waiting, unlike :func:`pcie_throughput_mib_s`; newer drivers and GPUs only (some
    drivers have them as 32-bit counters). Raises the pynvml exception of the first field
    NVML could not read.
    """
    rx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)
    tx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197)
    rx, tx = nvml.nvmlDeviceGetFieldValues(handle, [rx_id, tx_id])
    for field in (rx, tx):
        if field.nvmlReturn != 0:
            raise nvml.NVMLError(int(field.nvmlReturn))
    bits = min(_VALUE_BITS.get(int(rx.valueType), 64), _VALUE_BITS.get(int(tx.valueType), 64))
    return PcieCounters(_field_int(rx), _field_int(tx), int(max(rx.timestamp, tx.timestamp)), bits)


#: ``nvmlValueType_t`` -> the member of the ``nvmlValue_t`` union holding the number, its bits
_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
_VALUE_BITS = {1: 32, 2: 8 * ctypes.sizeof(ctypes.c_ulong), 3: 64, 4: 64, 5: 32, 6: 16}


def _field_int(field: Any) -> int:
    """The number in an ``nvmlFieldValue_t``, read through the union member its type names."""
    member = _VALUE_MEMBER.get(int(field.valueType), "ullVal")
    return int(getattr(field.value, member))


# --- GPM: the GPU Performance Monitoring metrics (Hopper and later) ---------------------------

#: ``nvmlGpmMetricId_t`` values (nvml.h) of the metrics the sampler reads, used where the
#: binding lacks the constant. Each is a percentage 0..100 over the time between two samples.
GPM_METRIC_IDS = {
    "sm_active": ("NVML_GPM_METRIC_SM_UTIL", 2),  #: share of SMs busy, averaged over time
    "sm_occupancy": ("NVML_GPM_METRIC_SM_OCCUPANCY", 3),  #: resident warps / the SMs' maximum
    "tensor_active": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),  #: time SMs ran tensor-core ops
    "dram_bw": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10),  #: DRAM bandwidth used / its maximum
}
#: ``NVML_GPM_METRICS_GET_VERSION`` and ``NVML_GPM_SUPPORT_VERSION`` (nvml.h), where missing.
GPM_METRICS_GET_VERSION = 1
GPM_SUPPORT_VERSION = 1


def gpm_metric_id(nvml: Any, key: str) -> int:
    """The NVML id of GPM metric ``key`` (a key of :data:`GPM_METRIC_IDS`)."""
    name, fallback = GPM_METRIC_IDS[key]
    return int(getattr(nvml, name, fallback))


def gpm_unsupported_reason(nvml: Any, handle: Any) -> str:
    """Why GPM metrics cannot be read from this device ('' when they can): the binding is too
    old for GPM, the driver's NVML has no GPM, or the GPU has none (before Hopper). Raises
    the pynvml exception of any other failure of ``nvmlGpmQueryDeviceSupport``."""
    needed = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmMetricsGet")
    missing = [f for f in needed if not hasattr(nvml, f)]
    if missing or not hasattr(nvml, "c_nvmlGpmMetricsGet_t"):
        lacking = missing[0] if missing else "c_nvmlGpmMetricsGet_t"
        return f"this nvidia-ml-py is too old for GPM (it has no {lacking})"
    try:
        support = nvml.nvmlGpmQueryDeviceSupport(handle)
    except Exception as exc:
        if error_code(exc) == FUNCTION_NOT_FOUND:
            return (
                f"the NVIDIA driver's NVML has no GPM ({error_text(exc)}; it needs R525 or later)"
            )
        raise
    if not support.isSupportedDevice:
        return "this GPU has no GPM metrics (Hopper and later GPUs have them)"
    return ""


def gpm_sample_alloc(nvml: Any) -> Any:
    """A GPM sample buffer (free it with :func:`gpm_sample_free`)."""
    return nvml.nvmlGpmSampleAlloc()


def gpm_sample_free(nvml: Any, sample: Any) -> None:
    nvml.nvmlGpmSampleFree(sample)


def gpm_sample(nvml: Any, handle: Any, sample: Any) -> None:
    """Read the device's GPM counters into ``sample``."""
    nvml.nvmlGpmSampleGet(handle, sample)


def gpm_metrics(
    nvml: Any, first: Any, second: Any, metric_ids: list[int]
) -> list[tuple[float | None, int]]:
    """The GPM metrics ``metric_ids`` between two samples (``first`` taken before ``second``),
    each as ``(value, NVML return code)``: a percentage 0..100 with code 0, or ``None`` with
    the code of the metric's own failure. Raises the pynvml exception of a failure of the
    whole call."""
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", GPM_METRICS_GET_VERSION)
    request.numMetrics = len(metric_ids)
    request.sample1 = first
    request.sample2 = second
    for i, metric in enumerate(metric_ids):
        request.metrics[i].metricId = metric
    nvml.nvmlGpmMetricsGet(request)
    out: list[tuple[float | None, int]] = []
    for i in range(len(metric_ids)):
        code = int(request.metrics[i].nvmlReturn)
        out.append((float(request.metrics[i].value) if code == 0 else None, code))
    return out
