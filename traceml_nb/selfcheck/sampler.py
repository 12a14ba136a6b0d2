"""The ``sampler`` check: the product path. A ``Run`` with samplers on a busy GPU must record
samples, and each column of its GPU table must be measured exactly when NVML itself supports
that field (no column lost, no number made up); the GPM columns exactly when the GPU has GPM.

The run lasts ``SAMPLER_RUN_S``: long enough for the fields read once a second (power,
temperature, GPM) to have been read."""

from __future__ import annotations

import math
import time
from typing import Any

from .cuda import busy_gpu, torch_module
from .nvml import UNSUPPORTED, nvml_fields, nvml_handle_for_cuda
from .results import FAIL, PASS, WARN, Budget, CheckResult

#: raw NVML field (``nvml_fields``) -> the sampler's column (``traceml_nb.engine.sampling.gpu``)
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
    # from :func:`gpm_fields`: measured where the GPU has GPM
    "gpm_sm_active": "sm_active_pct",
    "gpm_sm_occupancy": "sm_occupancy_pct",
    "gpm_tensor_active": "tensor_active_pct",
    "gpm_dram_bw": "dram_bw_pct",
}
SAMPLER_RUN_S = 2.5
#: Columns the sampler may leave empty in a short run although NVML supports them (PCIe
#: throughput is read at most once a second; byte counters need two readings), and the GPM
#: metrics besides SM activity, which a GPU with GPM may still not give one by one.
SAMPLER_SPARSE = (
    "pcie_rx_mbps",
    "pcie_tx_mbps",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_bw_pct",
)


def gpm_fields(why: str) -> dict[str, tuple[Any, str]]:
    """The GPM entries of the raw fields :func:`compare_sampler_with_nvml` takes: supported
    (``why`` empty: the GPU has GPM) or ``UNSUPPORTED``."""
    names = [name for name in SAMPLER_COLUMNS if name.startswith("gpm_")]
    return {name: (None, UNSUPPORTED) if why else ("supported", "") for name in names}


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
    torch = torch_module()
    import pynvml

    from ..engine.run import Run
    from .gpm_check import gpm_support

    index = torch.cuda.current_device()
    busy_gpu(torch, 1e3 * (SAMPLER_RUN_S + 1.0))
    with Run("selfcheck-sampler", device=index, sample=True, interval=0.1) as run:
        time.sleep(SAMPLER_RUN_S)
    pynvml.nvmlInit()
    try:
        handle = nvml_handle_for_cuda(pynvml, torch, index)
        raw = nvml_fields(pynvml, handle)
        raw.update(gpm_fields(gpm_support(pynvml, handle)))
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
