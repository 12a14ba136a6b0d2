"""GPU self-check of traceml_nb's measurements: ``python -m traceml_nb.selfcheck``.

On a CUDA machine, within a time budget (``--budget-s``, default 170 s), it checks:

``stall``      the CUDA-event input-stall measurement against injected delays. A dataset
               whose ``__getitem__`` sleeps ``D`` ms (``num_workers=0``) feeds a step that
               runs a tiny model (launch-bound: the GPU keeps up with the host) and then
               queues a GPU spin of a calibrated ``Q`` ms (``torch.cuda._sleep``). When the
               next fetch begins exactly ``Q`` ms of GPU work is queued, so the GPU idles for
               ``max(0, wait - Q)``: the measured median stall must be that within
               ``max(1 ms, 15% of D)``; the span must be ``max(GPU work, host time between
               fetches)`` within ``max(1 ms, 20%)``. Cases: ``Q = 0``, ``Q = D/2``, ``Q = 3D``.
``nvml``       every NVML field the sampler reads, while the GPU is busy: value, or
               "unsupported"; values must be plausible (utilisation > 0 under load, ...).
``sampler``    the product path: a ``Run`` with samplers on a busy GPU records samples, and
               a column is measured exactly when NVML itself supports that field.
``mapping``    ``CUDA_VISIBLE_DEVICES``: each torch device index maps to the NVML device of
               the same UUID, also in a child process that sees one GPU by UUID; and with
               ``CUDA_VISIBLE_DEVICES=''`` a run falls back to CPU with a reason.
``overhead``   plain versus ``host-only`` (tracer with host clocks), ``tracer`` (plus CUDA
               events) and ``monitor`` (plus samplers and the live view's writer, headless),
               alternating: a ResNet-18-sized conv net (torch.nn only, synthetic tensors; the
               monitor must add <= 1%, median) and a tiny host-bound MLP (informative), and
               the host cost of each CUDA call the tracer makes.

Every check runs in its own ``try``; an error is printed and the next check runs. Output is a
table on stdout and, with ``--json PATH``, a JSON file. Exit code 0 when every check passed,
1 when one failed (the table says which). Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PASS = "PASS"
FAIL = "FAIL"
WARN = "WARN"  #: worth a look, does not fail the self-check
INFO = "INFO"
SKIP = "SKIP"
ERROR = "ERROR"  #: the check itself crashed: counts as a failure
FAILING = (FAIL, ERROR)

DEFAULT_BUDGET_S = 170.0
WATCHDOG_GRACE_S = 25.0  #: past budget + grace, partial results are written and we exit 1

STALL_TOLERANCE_MIN_MS = 1.0
STALL_TOLERANCE_FRACTION = 0.15  #: of the injected data delay
SPAN_TOLERANCE_MIN_MS = 1.0
SPAN_TOLERANCE_FRACTION = 0.20  #: of the expected span
OVERHEAD_BUDGET_PCT = 1.0  #: ResNet-18-sized loop: traced may add at most this, median


# --- results ------------------------------------------------------------------------------------
@dataclass
class CheckResult:
    """The outcome of one check; ``details`` holds its numbers (JSON-serialisable)."""

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def exit_code(results: Sequence[CheckResult]) -> int:
    """1 when any check failed or crashed, else 0."""
    return 1 if any(r.status in FAILING for r in results) else 0


def format_table(results: Sequence[CheckResult]) -> str:
    """The final table: one line per check."""
    lines = [f"{'check':<10} {'status':<6} {'seconds':>7}  summary"]
    for r in results:
        lines.append(f"{r.name:<10} {r.status:<6} {r.seconds:>7.1f}  {r.summary}")
    failed = [r.name for r in results if r.status in FAILING]
    lines.append("result: " + (f"FAILED ({', '.join(failed)})" if failed else "all checks passed"))
    return "\n".join(lines)


class Budget:
    """A deadline ``seconds`` from now (monotonic clock)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._deadline = clock() + seconds

    def remaining(self) -> float:
        return self._deadline - self._clock()

    def allows(self, seconds: float) -> bool:
        """True when ``seconds`` more still fit in the budget."""
        return self.remaining() >= seconds


# --- pure verdicts: stall -----------------------------------------------------------------------
def expected_stall_ms(wait_ms: float, queued_ms: float) -> float:
    """GPU idle time per step when the host waits ``wait_ms`` for a batch while ``queued_ms``
    of GPU work is still queued from the previous step: that part of the wait overlaps GPU
    work, only the rest of it is a stall."""
    return max(0.0, wait_ms - queued_ms)


def stall_tolerance_ms(data_ms: float) -> float:
    return max(STALL_TOLERANCE_MIN_MS, STALL_TOLERANCE_FRACTION * data_ms)


def span_tolerance_ms(span_ms: float) -> float:
    return max(SPAN_TOLERANCE_MIN_MS, SPAN_TOLERANCE_FRACTION * span_ms)


def expected_span_ms(gpu_ms: float, host_ms: float | None) -> float:
    """GPU time from a batch's arrival to the next fetch: the step's GPU work, or the host's
    own time between the fetches when launching is slower than the GPU (launch-bound)."""
    return max(gpu_ms, host_ms or 0.0)


@dataclass
class StallCase:
    """One stall scenario and what was measured (all ms; medians over the steady steps).

    The step's host part (a tiny model, launch-bound) comes first and its last GPU work is a
    spin of ``queued_ms``, so when the next fetch begins exactly the spin is still queued.
    """

    name: str
    data_ms: float  #: injected sleep per batch
    queued_ms: float  #: calibrated GPU spin left queued when the fetch begins
    gpu_ms: float  #: calibrated GPU timeline of one step's work, from CUDA events
    stall_ms: float | None = None  #: measured median gpu_stall_ms
    span_ms: float | None = None  #: measured median gpu_span_ms
    wait_ms: float | None = None  #: measured median host data wait
    host_ms: float | None = None  #: measured median host time of a step outside the fetch
    rows: int = 0  #: steady steps the medians are taken over
    unresolved: int = 0  #: steps whose events never resolved (NaN)


def judge_stall_case(case: StallCase) -> tuple[bool, str]:
    """Whether the measured stall and span match the injected timeline; and a one-line why.

    Expected stall: ``max(0, host wait - queued GPU work)`` within ``max(1 ms, 15% of the
    injected delay)``; expected span: ``max(calibrated GPU work, host time between fetches)``
    within ``max(1 ms, 20%)``; the host wait itself: the injected delay within the stall
    tolerance.
    """
    head = f"{case.name}: data {case.data_ms:.1f} ms, queued GPU {case.queued_ms:.1f} ms"
    if case.rows == 0 or case.stall_ms is None or case.span_ms is None:
        return False, f"{head}: no resolved steps to judge"
    if case.unresolved:
        return False, f"{head}: {case.unresolved} step(s) with unresolved GPU events"
    wait = case.wait_ms if case.wait_ms is not None else case.data_ms
    expected = expected_stall_ms(wait, case.queued_ms)
    tol = stall_tolerance_ms(case.data_ms)
    problems = []
    if abs(case.stall_ms - expected) > tol:
        problems.append(f"stall {case.stall_ms:.2f} ms, expected {expected:.2f} +/- {tol:.2f}")
    span = expected_span_ms(case.gpu_ms, case.host_ms)
    span_tol = span_tolerance_ms(span)
    if abs(case.span_ms - span) > span_tol:
        problems.append(f"span {case.span_ms:.2f} ms, expected {span:.2f} +/- {span_tol:.2f}")
    if abs(wait - case.data_ms) > tol:
        problems.append(f"host wait {wait:.2f} ms, expected {case.data_ms:.2f} +/- {tol:.2f}")
    if problems:
        return False, f"{head}: " + "; ".join(problems)
    return True, (
        f"{head}: stall {case.stall_ms:.2f} ms (expected {expected:.2f} +/- {tol:.2f}), "
        f"span {case.span_ms:.2f} ms (expected {span:.2f}), host wait {wait:.2f} ms"
    )


def steady_medians(
    source: Sequence[int],
    flags: Sequence[int],
    stall_ms: Sequence[float],
    span_ms: Sequence[float],
    wait_ns: Sequence[int],
    wall_ns: Sequence[int],
    slot: int = 0,
    skip: int = 3,
) -> dict[str, Any]:
    """Medians of the steps of loader ``slot``, leaving out the first ``skip`` (warm-up) and
    truncated ones; ``unresolved`` counts steps whose GPU columns are still NaN."""
    from .record import FLAG_TRUNCATED

    rows = [i for i in range(len(source)) if source[i] == slot and not flags[i] & FLAG_TRUNCATED][
        skip:
    ]
    stalls = [stall_ms[i] for i in rows if not math.isnan(stall_ms[i])]
    spans = [span_ms[i] for i in rows if not math.isnan(span_ms[i])]
    return {
        "rows": len(rows),
        "unresolved": len(rows) - len(stalls),
        "stall_ms": statistics.median(stalls) if stalls else None,
        "span_ms": statistics.median(spans) if spans else None,
        "wait_ms": statistics.median(wait_ns[i] / 1e6 for i in rows) if rows else None,
        "host_ms": statistics.median((wall_ns[i] - wait_ns[i]) / 1e6 for i in rows)
        if rows
        else None,
    }


# --- pure verdicts: overhead ---------------------------------------------------------------------
def paired_added(plain_ns: Sequence[int], traced_ns: Sequence[int], steps: int) -> dict[str, float]:
    """Added time of traced over plain per repetition pair: us per step and % of the plain
    loop; median, min and max over the pairs."""
    if not plain_ns or len(plain_ns) != len(traced_ns):
        raise ValueError("need the same, non-zero number of plain and traced repetitions")
    us = [(t - p) / steps / 1e3 for p, t in zip(plain_ns, traced_ns, strict=True)]
    pct = [100.0 * (t - p) / p for p, t in zip(plain_ns, traced_ns, strict=True)]
    return {
        "median_us": statistics.median(us),
        "min_us": min(us),
        "max_us": max(us),
        "median_pct": statistics.median(pct),
        "min_pct": min(pct),
        "max_pct": max(pct),
        "plain_step_ms": statistics.median(plain_ns) / steps / 1e6,
        "pairs": len(us),
    }


def judge_overhead(added: dict[str, float], budget_pct: float = OVERHEAD_BUDGET_PCT) -> bool:
    """The traced loop passes when its median added time is within ``budget_pct``."""
    return added["median_pct"] <= budget_pct


# --- pure verdicts: NVML -------------------------------------------------------------------------
UNSUPPORTED = "unsupported"


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


def normalise_uuid(uuid: Any) -> str:
    """A GPU UUID as lower-case hex with dashes, without NVML's ``GPU-``/``MIG-`` prefix."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


# --- the checks (need CUDA) ---------------------------------------------------------------------
def _torch() -> Any:
    import torch

    return torch


def check_environment(budget: Budget) -> CheckResult:
    torch = _torch()
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    details = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": [
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gb": p.total_memory / 1e9,
            }
            for i, p in enumerate(props)
        ],
    }
    names = ", ".join(f"cuda:{d['index']} {d['name']}" for d in details["devices"])
    return CheckResult(
        "env",
        INFO,
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), {names}; "
        f"CUDA_VISIBLE_DEVICES={details['cuda_visible_devices']!r}",
        details,
    )


class _SleepyDataset:
    """``__getitem__`` sleeps ``sleep_s`` and returns the index: the injected data delay."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.sleep_s)
        return i


def _elapsed_ms(torch: Any, work: Callable[[], None]) -> float:
    """GPU time of ``work`` between two CUDA events (waits for the second: calibration only)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


class _GpuWork:
    """One step's GPU work: a tiny model's forward/backward/SGD step (launch-bound: the GPU
    keeps up with the host), then a GPU spin of ``spin_cycles`` queued last."""

    def __init__(self, torch: Any, device: Any, spin_cycles: int) -> None:
        nn = torch.nn
        self.torch = torch
        self.model = nn.Linear(256, 256).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(64, 256, device=device)
        self.spin_cycles = spin_cycles

    def __call__(self) -> None:
        loss = self.model(self.x).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.spin_cycles > 0:
            self.torch.cuda._sleep(self.spin_cycles)

    def gpu_ms(self, repeats: int = 5) -> tuple[float, float]:
        """Median GPU time of one whole call and of its spin alone, from CUDA events
        (synchronises: calibration only)."""
        torch = self.torch
        whole, spin = [], []
        for _ in range(repeats):
            torch.cuda.synchronize()
            whole.append(_elapsed_ms(torch, self))
            if self.spin_cycles > 0:
                spin.append(_elapsed_ms(torch, lambda: torch.cuda._sleep(self.spin_cycles)))
        return statistics.median(whole), (statistics.median(spin) if spin else 0.0)


def spin_cycles_per_ms(torch: Any) -> float:
    """How many ``torch.cuda._sleep`` cycles make one millisecond on this GPU now."""
    cycles = 20_000_000
    torch.cuda._sleep(cycles)  # warm-up: lets the clocks come up
    rates = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rates.append(cycles / start.elapsed_time(end))
    return statistics.median(rates)


def run_stall_case(
    torch: Any, name: str, data_ms: float, gpu_target_ms: float, rate: float, steps: int
) -> StallCase:
    """Train ``steps`` batches under a ``Run`` and collect the measured stall medians."""
    from torch.utils.data import DataLoader

    from .run import Run

    device = torch.device("cuda", torch.cuda.current_device())
    work = _GpuWork(torch, device, int(gpu_target_ms * rate))
    work()
    gpu_ms, queued_ms = work.gpu_ms()
    dataset: Any = _SleepyDataset(steps, data_ms / 1e3)
    loader: Any = DataLoader(dataset, batch_size=None, num_workers=0)
    torch.cuda.synchronize()
    with Run(f"selfcheck-{name}", device=device.index, sample=False) as run:
        for _batch in loader:
            work()
    cols = run.record.steps.snapshot()
    medians = steady_medians(
        cols.source, cols.flags, cols.gpu_stall_ms, cols.gpu_span_ms, cols.wait_ns, cols.wall_ns
    )
    return StallCase(name, data_ms, queued_ms, gpu_ms, **medians)


def check_stall(budget: Budget) -> CheckResult:
    torch = _torch()
    if not hasattr(torch.cuda, "_sleep"):
        return CheckResult("stall", SKIP, "torch.cuda._sleep is missing: no calibrated GPU work")
    rate = spin_cycles_per_ms(torch)
    plan = [  # (name, injected data delay ms, GPU spin queued last in each step ms)
        ("no-overlap", 20.0, 0.0),  # input-bound: the GPU idles for the whole wait
        ("half-overlap", 20.0, 10.0),  # half the wait is covered by queued GPU work
        ("gpu-bound", 10.0, 30.0),  # the wait is hidden behind GPU work: no stall
    ]
    cases: list[StallCase] = []
    failed: list[str] = []
    lines: list[str] = []
    steps = 24
    for name, data_ms, spin_ms in plan:
        if not budget.allows(steps * max(data_ms, spin_ms) / 1e3 * 2 + 5):
            failed.append(f"{name}: out of time budget")
            continue
        case = run_stall_case(torch, name, data_ms, spin_ms, rate, steps)
        ok, line = judge_stall_case(case)
        cases.append(case)
        lines.append(("ok   " if ok else "FAIL ") + line)
        print("  " + lines[-1], flush=True)
        if not ok:
            failed.append(line)
    details = {"spin_cycles_per_ms": rate, "cases": [asdict(c) for c in cases], "lines": lines}
    if failed:
        return CheckResult("stall", FAIL, "; ".join(failed), details)
    return CheckResult(
        "stall", PASS, f"{len(cases)}/{len(plan)} injected-delay cases match", details
    )


def _busy_gpu(torch: Any, ms: float) -> None:
    """Queue ``ms`` of GPU spinning (asynchronous)."""
    rate = spin_cycles_per_ms(torch)
    torch.cuda._sleep(int(ms * rate))


def nvml_fields(pynvml: Any, handle: Any) -> dict[str, tuple[Any, str]]:
    """Every field the NVML sampler reads, as ``(value, '' | 'unsupported' | 'error: ...')``."""

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
    return {name: nvml_reading(read) for name, read in readers.items()}


def _nvml_handle_for_cuda(pynvml: Any, torch: Any, index: int) -> Any:
    """The NVML handle of torch's ``cuda:index`` (by UUID: NVML ignores CUDA_VISIBLE_DEVICES)."""
    uuid = normalise_uuid(torch.cuda.get_device_properties(index).uuid)
    count = pynvml.nvmlDeviceGetCount()
    for i in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if normalise_uuid(pynvml.nvmlDeviceGetUUID(handle)) == uuid:
            return handle
    if count == 1 and torch.cuda.device_count() == 1:  # e.g. a MIG instance of the only GPU
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    raise LookupError(f"no NVML device has the UUID of cuda:{index} ({uuid})")


def check_nvml(budget: Budget) -> CheckResult:
    torch = _torch()
    import pynvml

    pynvml.nvmlInit()
    try:
        index = torch.cuda.current_device()
        handle = _nvml_handle_for_cuda(pynvml, torch, index)
        _busy_gpu(torch, 2500.0)  # keeps the GPU busy while the fields are read
        time.sleep(1.2)
        fields = nvml_fields(pynvml, handle)
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        driver = nvml_reading(pynvml.nvmlSystemGetDriverVersion)
    finally:
        pynvml.nvmlShutdown()
    values = {k: v for k, (v, why) in fields.items()}
    for name, (value, why) in fields.items():
        print(f"  {name:<20} {why or value}", flush=True)
    errors = [f"{k}: {why}" for k, (_v, why) in fields.items() if why.startswith("error")]
    unsupported = [k for k, (_v, why) in fields.items() if why == UNSUPPORTED]
    problems = implausible_nvml(values, busy)
    details = {
        "fields": {k: (why or v) for k, (v, why) in fields.items()},
        "driver": driver[0] or driver[1],
        "read_while_busy": busy,
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


#: raw NVML field (``nvml_fields``) -> the sampler's column (``traceml_nb.sampling.gpu``)
SAMPLER_COLUMNS = {
    "util_gpu_pct": "util_gpu_pct",
    "util_memory_pct": "util_mem_pct",
    "memory_used_mb": "mem_used_mb",
    "memory_total_mb": "mem_total_mb",
    "power_w": "power_w",
    "power_limit_w": "power_limit_w",
    "sm_clock_mhz": "sm_clock_mhz",
    "sm_clock_max_mhz": "sm_clock_max_mhz",
    "temperature_c": "temp_c",
    "pcie_rx_kbps": "pcie_rx_mbps",
    "pcie_tx_kbps": "pcie_tx_mbps",
    "clock_event_reasons": "throttle_reasons",
}
#: Columns the sampler may leave empty in a short run although NVML supports them (PCIe
#: throughput is read at most once a second; byte counters need two readings).
SAMPLER_SPARSE = ("pcie_rx_mbps", "pcie_tx_mbps")


def compare_sampler_with_nvml(
    raw: dict[str, tuple[Any, str]], sampled: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` from comparing the sampler's columns (last value or
    ``'unavailable'``) with what NVML itself answers (``nvml_fields``).

    A problem: a field NVML gives that the sampler shows as unavailable, or a value the
    sampler shows for a field NVML does not support (a made-up number), or a memory total
    that differs from NVML's by more than 1%.
    """
    problems: list[str] = []
    warnings: list[str] = []
    for field_name, column in SAMPLER_COLUMNS.items():
        if field_name not in raw:
            continue
        value, why = raw[field_name]
        if column not in sampled:
            warnings.append(f"the sampler has no column {column!r}")
            continue
        got = sampled[column]
        if why == UNSUPPORTED and got != "unavailable":
            problems.append(f"{column} = {got} although NVML does not support {field_name}")
        elif not why and got == "unavailable":
            text = f"{column} is unavailable although NVML gives {field_name} = {value}"
            (warnings if column in SAMPLER_SPARSE else problems).append(text)
    total, why = raw.get("memory_total_mb", (None, "missing"))
    got = sampled.get("mem_total_mb")
    if not why and isinstance(got, (int, float)) and total and abs(got - total) > 0.01 * total:
        problems.append(f"mem_total_mb {got:.0f} differs from NVML's {total:.0f} MiB")
    return problems, warnings


def check_sampler(budget: Budget) -> CheckResult:
    """A real ``Run`` with samplers on, on a busy GPU: the GPU table must have samples, and
    each column must be measured exactly when NVML itself supports the field."""
    torch = _torch()
    import pynvml

    from .run import Run

    index = torch.cuda.current_device()
    _busy_gpu(torch, 2500.0)
    with Run("selfcheck-sampler", device=index, sample=True, interval=0.1) as run:
        time.sleep(1.5)
    pynvml.nvmlInit()
    try:
        raw = nvml_fields(pynvml, _nvml_handle_for_cuda(pynvml, torch, index))
    finally:
        pynvml.nvmlShutdown()
    torch.cuda.synchronize()
    caps = run.capabilities
    table = run.record.gpus.get(index)
    details: dict[str, Any] = {"capabilities": caps.to_dict(), "busy_s": run.sampler_busy_s}
    if table is None:
        why = caps.why("nvml") or "; ".join(caps.notes) or "no GPU table"
        return CheckResult("sampler", FAIL, f"no GPU samples recorded: {why}", details)
    sampled: dict[str, Any] = {}
    for name, col in table.snapshot().items():
        if name == "t":
            continue
        present = [v for v in col if not math.isnan(v)]
        sampled[name] = present[-1] if present else "unavailable"
        print(f"  {name:<20} {sampled[name]}", flush=True)
    for note in caps.notes:
        print(f"  note: {note}", flush=True)
    problems, warnings = compare_sampler_with_nvml(raw, sampled)
    details.update(rows=len(table), columns=sampled, problems=problems, warnings=warnings)
    measured = [k for k, v in sampled.items() if v != "unavailable"]
    summary = (
        f"{len(table)} samples in {run.elapsed_s:.1f} s, {len(measured)}/{len(sampled)} columns "
        f"measured, sampler CPU {run.sampler_busy_s * 1e3:.0f} ms"
    )
    if len(table) == 0 or not measured or problems:
        return CheckResult("sampler", FAIL, "; ".join([summary, *problems]), details)
    if warnings:
        return CheckResult("sampler", WARN, "; ".join([summary, *warnings]), details)
    return CheckResult("sampler", PASS, summary, details)


_CHILD_MAPPING = r"""
import json, time, torch
out = {"count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
if out["count"]:
    out["uuid0"] = str(torch.cuda.get_device_properties(0).uuid)
from traceml_nb.run import Run
with Run("selfcheck-child", sample=True) as run:
    time.sleep(0.3)
out["device_kind"] = run.device_kind
out["gpu_tables"] = sorted(run.record.gpus)
out["gpu_events"] = run.capabilities.ok("gpu_events")
out["gpu_events_why"] = run.capabilities.why("gpu_events")
print("SELFCHECK-CHILD " + json.dumps(out))
"""


def _child(env_value: str, timeout: float) -> dict[str, Any]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=env_value)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD_MAPPING],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("SELFCHECK-CHILD "):
            return dict(json.loads(line.split(" ", 1)[1]))
    raise RuntimeError(
        f"child with CUDA_VISIBLE_DEVICES={env_value!r} failed: {proc.stderr.strip()[-500:]}"
    )


def check_mapping(budget: Budget) -> CheckResult:
    torch = _torch()
    import pynvml

    problems: list[str] = []
    mapping: dict[str, Any] = {}
    pynvml.nvmlInit()
    try:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            try:
                handle = _nvml_handle_for_cuda(pynvml, torch, i)
            except LookupError as exc:
                problems.append(str(exc))
                continue
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            nvml_index = pynvml.nvmlDeviceGetIndex(handle)
            mapping[f"cuda:{i}"] = {"nvml_index": nvml_index, "uuid": normalise_uuid(props.uuid)}
            bus = getattr(props, "pci_bus_id", None)
            if bus is not None and (bus, props.pci_device_id) != (pci.bus, pci.device):
                problems.append(
                    f"cuda:{i} PCI {bus}:{props.pci_device_id} != NVML {pci.bus}:{pci.device}"
                )
        last = torch.cuda.device_count() - 1
        target_uuid = "GPU-" + normalise_uuid(torch.cuda.get_device_properties(last).uuid)
    finally:
        pynvml.nvmlShutdown()
    for line in (f"{k} -> NVML {v['nvml_index']} ({v['uuid']})" for k, v in mapping.items()):
        print("  " + line, flush=True)
    children: dict[str, Any] = {}
    if budget.allows(40):
        child = _child(target_uuid, timeout=min(60.0, budget.remaining() - 10))
        children[target_uuid] = child
        print(f"  CUDA_VISIBLE_DEVICES={target_uuid}: {child}", flush=True)
        if child["count"] != 1:
            problems.append(
                f"with CUDA_VISIBLE_DEVICES={target_uuid} torch sees {child['count']} devices, not 1"
            )
        elif normalise_uuid(child.get("uuid0", "")) != normalise_uuid(target_uuid):
            problems.append(
                f"with CUDA_VISIBLE_DEVICES={target_uuid} cuda:0 is {child.get('uuid0')}"
            )
        if child["device_kind"] != "cuda" or not child["gpu_events"]:
            problems.append(f"a run in that child did not use the GPU: {child}")
    else:
        problems.append("out of time budget for the child processes")
    if budget.allows(25):
        child = _child("", timeout=min(60.0, budget.remaining() - 5))
        children[""] = child
        print(f"  CUDA_VISIBLE_DEVICES='': {child}", flush=True)
        if (
            child["count"] != 0
            or child["device_kind"] != "cpu"
            or child["gpu_events"]
            or not child["gpu_events_why"]
        ):
            problems.append(
                f"with no visible device a run should fall back to CPU with a reason: {child}"
            )
    details = {"mapping": mapping, "children": children, "problems": problems}
    summary = ", ".join(f"{k}->NVML {v['nvml_index']}" for k, v in mapping.items())
    if problems:
        return CheckResult("mapping", FAIL, summary + "; " + "; ".join(problems), details)
    return CheckResult(
        "mapping", PASS, summary + "; one-GPU child by UUID and no-GPU child behave", details
    )


def resnet18_like(torch: Any, num_classes: int = 1000) -> Any:
    """ResNet-18's layout from torch.nn only (11.7 M parameters; torchvision may be missing)."""
    nn = torch.nn

    module_base: Any = nn.Module

    class BasicBlock(module_base):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers: list[Any] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def _overhead_loop(torch: Any, kind: str, steps: int) -> tuple[Any, Callable[[Any], None]]:
    """``(loader, train_step)``: the loader yields index batches, the step computes on fixed
    synthetic GPU tensors (so the loop measures the GPU work plus our per-step cost)."""
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    if kind == "resnet18":
        model = resnet18_like(torch).to(device)
        batch = 64
        x = torch.randn(batch, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        ).to(device)
        batch = 64
        x = torch.randn(batch, 32, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(TensorDataset(torch.arange(steps * batch)), batch_size=batch, num_workers=0)

    def train_step(_batch: Any) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return loader, train_step


OVERHEAD_VARIANTS = ("plain", "host-only", "tracer", "monitor")


def _live_view() -> tuple[Any, str]:
    """``(LiveView class, '')`` or ``(None, why it cannot be imported)``."""
    try:
        from .views.live import LiveView
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return LiveView, ""


def _time_loop(
    torch: Any, loader: Any, train_step: Callable[[Any], None], variant: str
) -> dict[str, Any]:
    """One epoch under ``variant``: ``plain``; ``host-only`` (a Run on device ``cpu``: the
    step tracer with host clocks, no CUDA events); ``tracer`` (a Run on the GPU without
    samplers: the step tracer and its CUDA events); ``monitor`` (a Run with samplers and the live view's writer,
    headless). Wall time in ns from a synchronised start to a synchronised end; starting and
    stopping the run are outside it."""
    from .run import Run

    run = view = None
    if variant != "plain":
        device = "cpu" if variant == "host-only" else torch.cuda.current_device()
        run = Run("selfcheck-overhead", device=device, sample=variant == "monitor", interval=0.1)
        run.start()
        live_view, _why = _live_view() if variant == "monitor" else (None, "")
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for b in loader:
            train_step(b)
        torch.cuda.synchronize()
        loop_ns = time.perf_counter_ns() - t0
    finally:
        try:
            if view is not None:
                getattr(view, "close", view.stop)()
        finally:
            if run is not None:
                run.stop()
    out: dict[str, Any] = {"loop_ns": loop_ns}
    if run is not None and variant == "monitor":
        out["sampler_core_pct"] = 100.0 * run.sampler_busy_s / max(run.elapsed_s, 1e-9)
        out["view_pct"] = (
            100.0 * float(getattr(view, "busy_s", 0.0)) / max(run.elapsed_s, 1e-9) if view else None
        )
    return out


def cuda_call_costs_us(torch: Any, n: int = 2000) -> dict[str, float]:
    """Host time of the CUDA calls the tracer makes per step, microseconds each."""
    stream = torch.cuda.current_stream()
    done_a, done_b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    done_a.record(stream)
    done_b.record(stream)
    torch.cuda.synchronize()
    device = torch.cuda.current_device()
    calls: dict[str, Callable[[], Any]] = {
        "current_stream": lambda: torch.cuda.current_stream(device),
        "new_event_record_free": lambda: torch.cuda.Event(enable_timing=True).record(stream),
        "record_reused_event": lambda: done_a.record(stream),
        "query": done_b.query,
        "elapsed_time": lambda: done_a.elapsed_time(done_b),
    }
    costs = {}
    for name, call in calls.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            call()
        costs[name] = (time.perf_counter_ns() - t0) / n / 1e3
        torch.cuda.synchronize()
        if name == "record_reused_event":
            done_b.record(stream)
            torch.cuda.synchronize()
    return costs


def check_overhead(budget: Budget) -> CheckResult:
    torch = _torch()
    plan = [("resnet18", 30, 10, True), ("tiny-mlp", 200, 10, False)]  # kind, steps, reps, judged
    loops: dict[str, Any] = {}
    status = PASS
    lines = []
    for kind, steps, reps, judged in plan:
        loader, train_step = _overhead_loop(torch, kind, steps)
        warm = [_time_loop(torch, loader, train_step, v)["loop_ns"] for v in OVERHEAD_VARIANTS]
        per_rep_s = 1.5 * sum(warm) / 1e9 + 1.0
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in OVERHEAD_VARIANTS}
        for rep in range(reps):
            if not budget.allows(per_rep_s + 12):
                break
            k = rep % len(OVERHEAD_VARIANTS)
            for variant in OVERHEAD_VARIANTS[k:] + OVERHEAD_VARIANTS[:k]:
                runs[variant].append(_time_loop(torch, loader, train_step, variant))
        if not runs["plain"]:
            lines.append(f"{kind}: skipped, out of time budget")
            status = FAIL if judged else status
            print("  " + lines[-1], flush=True)
            continue
        plain = [r["loop_ns"] for r in runs["plain"]]
        entry: dict[str, Any] = {
            "steps": steps,
            "plain_step_ms": statistics.median(plain) / steps / 1e6,
        }
        parts = [f"{kind:<9} plain {entry['plain_step_ms']:7.3f} ms/step"]
        for variant in OVERHEAD_VARIANTS[1:]:
            added = paired_added(plain, [r["loop_ns"] for r in runs[variant]], steps)
            entry[variant] = added
            parts.append(
                f"{variant} {added['median_us']:+7.1f} us ({added['median_pct']:+.2f}%, "
                f"{added['min_pct']:+.2f} .. {added['max_pct']:+.2f}%)"
            )
        mon = [r for r in runs["monitor"] if r.get("sampler_core_pct") is not None]
        if mon:
            entry["sampler_core_pct"] = statistics.median(r["sampler_core_pct"] for r in mon)
        ok = judge_overhead(entry["monitor"])
        verdict = ("ok" if ok else "OVER") if judged else "info"
        if judged and not ok:
            status = FAIL
        if "sampler_core_pct" in entry:
            parts.append(f"samplers {entry['sampler_core_pct']:.1f}% of a core")
        lines.append("  ".join(parts) + f"  [{len(plain)} reps] {verdict}")
        print("  " + lines[-1], flush=True)
        loops[kind] = entry
    costs = cuda_call_costs_us(torch)
    live_view, why = _live_view()
    view_text = "on" if live_view is not None else f"not available ({why})"
    lines.append(
        "CUDA calls on the host, us each: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items())
    )
    lines.append(f"live view: {view_text}")
    print("  " + lines[-2] + "\n  " + lines[-1], flush=True)
    details = {
        "loops": loops,
        "cuda_call_us": costs,
        "view": view_text,
        "budget_pct": OVERHEAD_BUDGET_PCT,
        "lines": lines,
    }
    summary = "; ".join(
        f"{k} monitor {v['monitor']['median_pct']:+.2f}% ({v['monitor']['median_us']:+.1f} us/step), "
        f"tracer {v['tracer']['median_us']:+.1f}, host-only {v['host-only']['median_us']:+.1f} us/step"
        for k, v in loops.items()
    )
    return CheckResult("overhead", status, summary + f"; live view {view_text}", details)


# --- driver ------------------------------------------------------------------------------------
CHECKS: list[tuple[str, Callable[[Budget], CheckResult], float]] = [
    # (name, check, seconds it needs at least)
    ("env", check_environment, 1),
    ("stall", check_stall, 8),
    ("nvml", check_nvml, 5),
    ("sampler", check_sampler, 5),
    ("mapping", check_mapping, 30),
    ("overhead", check_overhead, 20),
]


def run_check(
    name: str, check: Callable[[Budget], CheckResult], budget: Budget, needs_s: float
) -> CheckResult:
    """Run one check; a crash becomes an ERROR result, a lack of time a SKIP."""
    if not budget.allows(needs_s):
        return CheckResult(
            name, SKIP, f"not enough of the time budget left ({budget.remaining():.0f} s)"
        )
    t0 = time.monotonic()
    try:
        result = check(budget)
    except Exception as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        result = CheckResult(name, ERROR, f"{type(exc).__name__}: {exc}", {"traceback": tb})
    result.seconds = time.monotonic() - t0
    return result


def _report(results: Sequence[CheckResult], budget_s: float, note: str = "") -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "budget_s": budget_s,
        "note": note,
        "exit_code": exit_code(results),
        "checks": [asdict(r) for r in results],
    }


def _write_json(path: str | None, report: dict[str, Any]) -> None:
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=2, default=str)
    except OSError as exc:
        print(f"could not write {path}: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m traceml_nb.selfcheck", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="total time budget (s)"
    )
    parser.add_argument("--json", help="also write the results as JSON to this path")
    parser.add_argument("--only", help="comma-separated checks to run (default: all)")
    args = parser.parse_args(argv)
    budget = Budget(args.budget_s)
    results: list[CheckResult] = []
    current = ["start"]

    def on_timeout() -> None:
        msg = f"time budget exceeded by {WATCHDOG_GRACE_S:.0f} s while running {current[0]!r}; giving up"
        print(msg, flush=True)
        results.append(CheckResult(current[0], ERROR, msg))
        print(format_table(results), flush=True)
        _write_json(args.json, _report(results, args.budget_s, msg))
        os._exit(1)

    watchdog = threading.Timer(args.budget_s + WATCHDOG_GRACE_S, on_timeout)
    watchdog.name = "selfcheck-watchdog"
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            import torch

            has_cuda = torch.cuda.is_available()
            why = (
                ""
                if has_cuda
                else f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees no CUDA device"
            )
        except Exception as exc:
            has_cuda, why = False, f"torch could not be imported: {type(exc).__name__}: {exc}"
        if not has_cuda:
            msg = f"no CUDA: {why}; nothing to check on this machine"
            print(msg, flush=True)
            _write_json(args.json, _report([CheckResult("cuda", SKIP, msg)], args.budget_s, msg))
            return 0
        only = {s.strip() for s in args.only.split(",")} if args.only else None
        for name, check, needs in CHECKS:
            if only is not None and name not in only:
                continue
            current[0] = name
            print(f"[{name}] ...", flush=True)
            result = run_check(name, check, budget, needs)
            results.append(result)
            print(
                f"[{name}] {result.status} ({result.seconds:.1f} s): {result.summary}", flush=True
            )
        print(format_table(results), flush=True)
        _write_json(args.json, _report(results, args.budget_s))
        return exit_code(results)
    finally:
        watchdog.cancel()


if __name__ == "__main__":
    sys.exit(main())
