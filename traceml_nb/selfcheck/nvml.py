"""The ``nvml`` check: every NVML field the sampler reads, read directly from NVML while the
GPU is busy: a value, or "unsupported"; values must be plausible (utilisation > 0 under load,
memory used within the total, power and clocks within their limits, ...). It also times each
read (host microseconds a call, :func:`nvml_field_costs_us`): what the sampler's read periods
are chosen against.

Also the NVML helpers the ``sampler`` and ``mapping`` checks share: reading one field
(:func:`nvml_reading`), all of them (:func:`nvml_fields`) and the NVML device of a torch
device, matched by UUID (:func:`nvml_handle_for_cuda`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..engine.sampling.gpu_devices import normalise_uuid
from .cuda import busy_gpu, torch_module
from .results import FAIL, PASS, WARN, Budget, CheckResult

UNSUPPORTED = "unsupported"


# --- pure verdicts -------------------------------------------------------------------------------
def nvml_reading(read: Callable[[], Any]) -> tuple[Any, str]:
    """``(value, '')``, ``(None, 'unsupported')`` or ``(None, 'error: ...')`` for one field."""
    try:
        return read(), ""
    except Exception as exc:
        import pynvml

        if isinstance(exc, pynvml.NVMLError_NotSupported):
            return None, UNSUPPORTED
        return None, f"error: {type(exc).__name__}: {exc}"


def implausible_nvml(values: dict[str, Any], busy: bool) -> list[str]:
    """What is wrong with the NVML values read (``None`` = unsupported, not judged).

    ``busy``: the GPU ran a kernel for the whole utilisation window, so it must read > 0.
    """
    problems = []

    def get(name: str) -> Any:
        return values.get(name)

    for name in ("util_gpu_pct", "util_memory_pct"):
        v = get(name)
        if v is not None and not 0 <= v <= 100:
            problems.append(f"{name} = {v} is outside 0..100")
    if busy and get("util_gpu_pct") == 0:
        problems.append("util_gpu_pct reads 0 while a kernel kept the GPU busy")
    used, total = get("memory_used_mb"), get("memory_total_mb")
    if total is None:
        problems.append("memory total is not readable")
    elif used is not None and not 0 <= used <= total:
        problems.append(f"memory used {used} MB is outside 0..{total} MB")
    power, limit = get("power_w"), get("power_limit_w")
    if power is not None and not 0 < power < 2000:
        problems.append(f"power {power} W is implausible")
    if power is not None and limit is not None and power > 1.5 * limit:
        problems.append(f"power {power} W is far above its limit {limit} W")
    sm, sm_max = get("sm_clock_mhz"), get("sm_clock_max_mhz")
    if sm is not None and sm_max is not None and sm > 1.1 * sm_max:
        problems.append(f"SM clock {sm} MHz is above its maximum {sm_max} MHz")
    if busy and sm == 0:
        problems.append("SM clock reads 0 MHz while busy")
    temp = get("temperature_c")
    if temp is not None and not 0 < temp < 125:
        problems.append(f"temperature {temp} C is implausible")
    for name in ("pcie_rx_kbps", "pcie_tx_kbps"):
        v = get(name)
        if v is not None and v < 0:
            problems.append(f"{name} = {v} is negative")
    return problems


def uuid_key(uuid: Any) -> str:
    """The key two GPU UUIDs are compared by: the sampler's own :func:`normalise_uuid` (hex
    digits only, no ``GPU-``/``MIG-`` prefix, lower case) of torch's UUID object, an NVML
    string, or the ``bytes`` older pynvml versions return."""
    return normalise_uuid(_text(uuid))


def uuid_text(uuid: Any) -> str:
    """A UUID as the self-check prints it and as ``CUDA_VISIBLE_DEVICES`` takes it after a
    ``GPU-`` prefix: lower-case hex with its dashes, without NVML's ``GPU-``/``MIG-`` prefix.
    For printing and for the environment only; UUIDs are compared by :func:`uuid_key`, which
    drops the dashes too."""
    text = _text(uuid).strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


def _text(uuid: Any) -> str:
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


# --- reading NVML (needs a GPU) ------------------------------------------------------------------
def nvml_fields(pynvml: Any, handle: Any) -> dict[str, tuple[Any, str]]:
    """Every field the NVML sampler reads, as ``(value, '' | 'unsupported' | 'error: ...')``."""
    return {name: nvml_reading(read) for name, read in nvml_readers(pynvml, handle).items()}


def nvml_field_costs_us(pynvml: Any, handle: Any, calls: int = 20) -> dict[str, float]:
    """Host time of one read of each field, microseconds (median of ``calls``); fields that
    fail are left out. PCIe throughput blocks for NVML's own window (about 20 ms)."""
    costs = {}
    for name, read in nvml_readers(pynvml, handle).items():
        if nvml_reading(read)[1]:
            continue
        times = []
        for _ in range(calls if "pcie" not in name else 2):
            t0 = time.perf_counter_ns()
            read()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        costs[name] = statistics.median(times)
    return costs


def nvml_readers(pynvml: Any, handle: Any) -> dict[str, Callable[[], Any]]:
    """How each field is read, by name (see :func:`nvml_fields`)."""

    def mb(v: float) -> float:
        return v / 2**20

    def clocks_event_reasons() -> int:
        get = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        get = get or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(get(handle))

    readers: dict[str, Callable[[], Any]] = {
        "name": lambda: pynvml.nvmlDeviceGetName(handle),
        "util_gpu_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        "util_memory_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).memory,
        "memory_used_mb": lambda: mb(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        "memory_total_mb": lambda: mb(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
        "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3,
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
            handle, pynvml.NVML_TEMPERATURE_GPU
        ),
        "pcie_rx_kbps": lambda: pynvml.nvmlDeviceGetPcieThroughput(
            handle, pynvml.NVML_PCIE_UTIL_RX_BYTES
        ),
        "pcie_tx_kbps": lambda: pynvml.nvmlDeviceGetPcieThroughput(
            handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
        ),
        "clock_event_reasons": clocks_event_reasons,
        "mig_mode": lambda: pynvml.nvmlDeviceGetMigMode(handle)[0],
    }
    return readers


def nvml_handle_for_cuda(pynvml: Any, torch: Any, index: int) -> Any:
    """The NVML handle of torch's ``cuda:index`` (by UUID: NVML ignores CUDA_VISIBLE_DEVICES)."""
    uuid = torch.cuda.get_device_properties(index).uuid
    key = uuid_key(uuid)
    count = pynvml.nvmlDeviceGetCount()
    for i in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if uuid_key(pynvml.nvmlDeviceGetUUID(handle)) == key:
            return handle
    if count == 1 and torch.cuda.device_count() == 1:  # e.g. a MIG instance of the only GPU
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    raise LookupError(f"no NVML device has the UUID of cuda:{index} ({uuid_text(uuid)})")


def check_nvml(budget: Budget) -> CheckResult:
    torch = torch_module()
    import pynvml

    pynvml.nvmlInit()
    try:
        index = torch.cuda.current_device()
        handle = nvml_handle_for_cuda(pynvml, torch, index)
        busy_gpu(torch, 2500.0)  # keeps the GPU busy while the fields are read
        time.sleep(1.2)
        fields = nvml_fields(pynvml, handle)
        busy = not torch.cuda.current_stream().query()
        costs = nvml_field_costs_us(pynvml, handle)
        torch.cuda.synchronize()
        driver = nvml_reading(pynvml.nvmlSystemGetDriverVersion)
    finally:
        pynvml.nvmlShutdown()
    values = {k: v for k, (v, why) in fields.items()}
    for name, (value, why) in fields.items():
        cost = f"  ({costs[name]:.1f} us a read)" if name in costs else ""
        print(f"  {name:<20} {why or value}{cost}", flush=True)
    errors = [f"{k}: {why}" for k, (_v, why) in fields.items() if why.startswith("error")]
    unsupported = [k for k, (_v, why) in fields.items() if why == UNSUPPORTED]
    problems = implausible_nvml(values, busy)
    details = {
        "fields": {k: (why or v) for k, (v, why) in fields.items()},
        "driver": driver[0] or driver[1],
        "read_while_busy": busy,
        "read_us": costs,
        "problems": problems,
        "errors": errors,
    }
    supported = len(fields) - len(unsupported) - len(errors)
    summary = (
        f"{supported}/{len(fields)} fields read, unsupported: {', '.join(unsupported) or 'none'}"
    )
    if problems:
        return CheckResult("nvml", FAIL, summary + "; " + "; ".join(problems), details)
    if errors:
        return CheckResult("nvml", WARN, summary + "; errors: " + "; ".join(errors), details)
    return CheckResult("nvml", PASS, summary, details)
