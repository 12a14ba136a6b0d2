"""The ``gpm`` check: SM activity and the other GPM metrics, read through the sampler's own
binding (:mod:`traceml_nb.engine.sampling.nvml_binding`) against two loads of a known shape.

* A one-thread spin (``torch.cuda._sleep``): a kernel runs all the time, so NVML's
  utilisation reads near 100%, yet one SM of many is busy: SM activity must stay below
  ``GPM_SPIN_MAX_SM_ACTIVE_PCT``. This is the case the sampler reads GPM for.
* Large half-precision matrix products: every SM busy (SM activity at least
  ``GPM_MATMUL_MIN_SM_ACTIVE_PCT``), tensor cores active.

Each window is two GPM samples ``GPM_WINDOW_S`` apart while the load runs. On a GPU without
GPM (a T4, an A100) the check says why, with the sampler's reason, and passes: the sampler
then shows the columns as unavailable (the ``sampler`` check compares). The verdict
(:func:`judge_gpm`) is a pure function, tested without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..engine.sampling import nvml_binding as nb
from ..engine.sampling.gpm import GPM_COLUMNS
from .cuda import busy_gpu, elapsed_ms, torch_module
from .results import FAIL, INFO, PASS, WARN, Budget, CheckResult

GPM_WINDOW_S = 1.0  #: seconds between the two samples of a window
GPM_SPIN_MAX_SM_ACTIVE_PCT = 10.0  #: a one-thread kernel keeps at most this share of SMs busy
GPM_MATMUL_MIN_SM_ACTIVE_PCT = 50.0  #: large matrix products keep at least this share busy


def judge_gpm(
    spin: dict[str, float | None], matmul: dict[str, float | None], spin_util_pct: float | None
) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of the GPM readings of the two windows (columns of
    ``GPM_COLUMNS``, None: the metric failed) and NVML's utilisation during the spin."""
    problems: list[str] = []
    warnings: list[str] = []
    for name, window in (("spin", spin), ("matmul", matmul)):
        for column, value in window.items():
            if value is not None and not 0.0 <= value <= 100.5:
                problems.append(f"{column} = {value:.1f} during the {name} is outside 0..100")
        if window.get("sm_active_pct") is None:
            problems.append(f"no SM activity during the {name} although the GPU has GPM")
    active = spin.get("sm_active_pct")
    if active is not None and active > GPM_SPIN_MAX_SM_ACTIVE_PCT:
        problems.append(
            f"SM activity {active:.1f}% for a one-thread kernel (at most "
            f"{GPM_SPIN_MAX_SM_ACTIVE_PCT:.0f}% expected)"
        )
    active = matmul.get("sm_active_pct")
    if active is not None and active < GPM_MATMUL_MIN_SM_ACTIVE_PCT:
        problems.append(
            f"SM activity {active:.1f}% during large matrix products (at least "
            f"{GPM_MATMUL_MIN_SM_ACTIVE_PCT:.0f}% expected)"
        )
    tensor = matmul.get("tensor_active_pct")
    if not tensor:
        warnings.append("no tensor-core activity during half-precision matrix products")
    if spin_util_pct is not None and spin_util_pct < 50:
        warnings.append(f"NVML utilisation {spin_util_pct:.0f}% while a kernel ran throughout")
    return problems, warnings


def gpm_support(pynvml: Any, handle: Any) -> str:
    """'' when the device gives GPM metrics, else why not (the sampler's own reason)."""
    try:
        return nb.gpm_unsupported_reason(pynvml, handle)
    except Exception as exc:
        return f"GPM could not be read ({nb.error_text(exc)})"


def gpm_window(pynvml: Any, handle: Any, seconds: float) -> dict[str, float | None]:
    """The GPM metrics of ``handle`` over the next ``seconds`` (the caller keeps it loaded)."""
    samples = [nb.gpm_sample_alloc(pynvml), nb.gpm_sample_alloc(pynvml)]
    try:
        nb.gpm_sample(pynvml, handle, samples[0])
        time.sleep(seconds)
        nb.gpm_sample(pynvml, handle, samples[1])
        ids = [nb.gpm_metric_id(pynvml, metric) for metric in GPM_COLUMNS.values()]
        results = nb.gpm_metrics(pynvml, samples[0], samples[1], ids)
    finally:
        for sample in samples:
            nb.gpm_sample_free(pynvml, sample)
    return {column: value for column, (value, _code) in zip(GPM_COLUMNS, results, strict=True)}


def _matmul_load(torch: Any, seconds: float) -> Callable[[], None]:
    """Queues half-precision matrix products for about ``seconds`` of GPU time."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    a @ b  # warm-up: cuBLAS picks its kernel
    per_ms = elapsed_ms(torch, lambda: a @ b)
    count = max(1, int(seconds * 1e3 / max(per_ms, 1e-3)))

    def load() -> None:
        for _ in range(count):
            a @ b

    return load


def check_gpm(budget: Budget) -> CheckResult:
    torch = torch_module()
    import pynvml

    from .nvml import nvml_handle_for_cuda

    pynvml.nvmlInit()
    try:
        index = torch.cuda.current_device()
        handle = nvml_handle_for_cuda(pynvml, torch, index)
        why = gpm_support(pynvml, handle)
        if why:
            print(f"  GPM: {why}", flush=True)
            return CheckResult(
                "gpm", INFO, f"GPM unavailable, as the sampler says: {why}", {"why": why}
            )
        window = GPM_WINDOW_S + 0.5
        busy_gpu(torch, 1e3 * (window + 0.5))
        time.sleep(0.2)
        spin = gpm_window(pynvml, handle, GPM_WINDOW_S)
        spin_util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        torch.cuda.synchronize()
        load = _matmul_load(torch, window + 0.5)
        load()
        time.sleep(0.2)
        matmul = gpm_window(pynvml, handle, GPM_WINDOW_S)
        torch.cuda.synchronize()
    finally:
        pynvml.nvmlShutdown()
    for name, values in (("one-thread spin", spin), ("fp16 matmul", matmul)):
        shown = ", ".join(
            f"{k} {'unavailable' if v is None else f'{v:.1f}'}" for k, v in values.items()
        )
        print(f"  {name:<16} {shown}", flush=True)
    print(f"  NVML utilisation during the spin: {spin_util:.0f}%", flush=True)
    problems, warnings = judge_gpm(spin, matmul, spin_util)
    details = {"spin": spin, "matmul": matmul, "spin_util_pct": spin_util}
    details.update(problems=problems, warnings=warnings)

    def pct(v: float | None) -> str:
        return "unavailable" if v is None else f"{v:.0f}%"

    summary = (
        f"SM activity {pct(spin['sm_active_pct'])} for a one-thread spin (NVML utilisation "
        f"{spin_util:.0f}%), {pct(matmul['sm_active_pct'])} for fp16 matmuls (tensor "
        f"{pct(matmul['tensor_active_pct'])}, DRAM {pct(matmul['dram_bw_pct'])})"
    )
    if problems:
        return CheckResult("gpm", FAIL, "; ".join([summary, *problems]), details)
    if warnings:
        return CheckResult("gpm", WARN, "; ".join([summary, *warnings]), details)
    return CheckResult("gpm", PASS, summary, details)
