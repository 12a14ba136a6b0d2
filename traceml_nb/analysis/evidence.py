"""The numbers behind a verdict, each measured or unavailable (with why), in a fixed order; the
views write them (:mod:`traceml_nb.views.diagnosis_words`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .advice import loader_settings, role_of
from .findings import UNAVAILABLE, Evidence, Finding, Summary
from .summary import Measurements
from .thresholds import STALL_FACTOR, STALL_MAX_SHARE
from .throttle import ThrottleFinding


@dataclass
class InputSignal:
    """How much the steps waited for input, by the best measure this run has.

    On CUDA that is the GPU input stall (CUDA events); otherwise the host data wait. ``fallback``
    marks a GPU run judged on host data wait (which overstates what the GPU lost, because the
    GPU may still be busy with queued work while the host waits).
    """

    kind: str | None  #: "gpu", "host" or None (nothing measured)
    #: of the steady step time, the stalls left out (what the input-bound rules judge)
    share: float | None
    per_step_ms: float | None  #: mean over the steady steps, the stalls left out
    run_s: float | None  #: over every measured step of the run, warm-up and stalls included
    fallback: bool = False
    why: str = ""
    stalls: list[Stall] = field(default_factory=list)
    #: with the stalls: the share of the steady step time spent waiting
    share_with_stalls: float | None = None

    @property
    def label(self) -> str:
        return "GPU input stall" if self.kind == "gpu" else "data wait"


@dataclass(frozen=True)
class Stall:
    """One step whose input wait dwarfs the others (``STALL_FACTOR``)."""

    step: int  #: its number in the run, from 1
    wait_ms: float


def find_stalls(wait_ms: np.ndarray, wall_ms: np.ndarray, numbers: np.ndarray) -> list[Stall]:
    """The steps (``numbers``: their step numbers) whose wait is more than ``STALL_FACTOR`` ×
    the median step, when there are at most ``STALL_MAX_SHARE`` of them (at least one)."""
    if not len(wall_ms):
        return []
    waits = np.where(np.isfinite(wait_ms), wait_ms, 0.0)
    big = np.flatnonzero(waits > STALL_FACTOR * float(np.median(wall_ms)))
    if not len(big) or len(big) > max(1, int(STALL_MAX_SHARE * len(wall_ms))):
        return []
    return [Stall(int(numbers[i]), float(waits[i])) for i in big]


def _without(
    waits: np.ndarray, walls: np.ndarray, stalls: list[Stall], numbers: np.ndarray
) -> tuple[float | None, float | None]:
    """(share, mean per step) of ``waits`` in ``walls`` with each stall's wait taken out of its
    step (the run as it would have been without the stalls); the mean is over the other steps."""
    waits = np.where(np.isfinite(waits), waits, 0.0)
    out = np.isin(numbers, [s.step for s in stalls])
    walls = walls - np.where(out, waits, 0.0)
    kept = waits[~out]
    total = float(walls.sum())
    share = float(kept.sum()) / total if total > 0 else None
    return share, float(kept.mean()) if len(kept) else None


def input_signal(summary: Summary, m: Measurements) -> InputSignal:
    numbers = m.steady_index + 1
    if m.gpu_in_use and summary.gpu_stall_share is not None:
        ok = np.isfinite(m.stall_ms)
        stalls = find_stalls(m.stall_ms[ok], m.wall_ms[ok], numbers[ok])
        share, per_step = _without(m.stall_ms[ok], m.wall_ms[ok], stalls, numbers[ok])
        return InputSignal(
            "gpu", share, per_step, m.run_stall_s, stalls=stalls,
            share_with_stalls=summary.gpu_stall_share,
        )  # fmt: skip
    if summary.data_wait_share is not None:
        stalls = find_stalls(m.wait_ms, m.wall_ms, numbers)
        share, per_step = _without(m.wait_ms, m.wall_ms, stalls, numbers)
        return InputSignal(
            "host", share, per_step, m.run_wait_s, m.gpu_in_use, stalls=stalls,
            share_with_stalls=summary.data_wait_share,
        )  # fmt: skip
    why = summary.unavailable.get("data_wait_share", "not measured")
    return InputSignal(None, None, None, None, why=why)


def _unavailable(label: str, why: str) -> Evidence:
    return Evidence(label, None, Finding(UNAVAILABLE, {"why": why}))


def _share_evidence(
    label: str, share: float | None, per_step: float | None, why: str, signal: InputSignal
) -> Evidence:
    """``input-share``: ``share`` of the step time, ``per_step_ms``; where the signal judged
    on this measure left stalls out, the share without them and the ``stalls``' steps."""
    if share is None:
        return _unavailable(label, why)
    if signal.label == label and signal.stalls and signal.share is not None:
        facts = {
            "share": signal.share,
            "per_step_ms": signal.per_step_ms,
            "share_with_stalls": share,
            "stall_steps": [st.step for st in signal.stalls],
        }
        return Evidence(label, signal.share, Finding("input-share", facts))
    return Evidence(label, share, Finding("input-share", {"share": share, "per_step_ms": per_step}))


def collect(
    summary: Summary, m: Measurements, signal: InputSignal, throttle: ThrottleFinding | None
) -> list[Evidence]:
    """The evidence list shown with every verdict."""
    s = summary
    why = s.unavailable
    ev = [
        Evidence(
            "steady steps",
            float(s.steady_steps),
            Finding("steady-steps", {"steps": s.steady_steps, "warmup_steps": s.warmup_steps}),
        )
    ]
    if s.step_ms_median is None:
        ev.append(_unavailable("step time", why.get("step_ms_median", "no steady steps")))
    else:
        facts: dict[str, Any] = {
            "median_ms": s.step_ms_median,
            "p10_ms": s.step_ms_p10,
            "p90_ms": s.step_ms_p90,
        }
        if s.step_block > 1 and m.loader is not None:
            facts.update(block=s.step_block, workers=m.loader.num_workers)
        ev.append(Evidence("step time", s.step_ms_median, Finding("step-time", facts)))
    wait_per_step = float(m.wait_ms.mean()) if m.steady else None
    ev.append(
        _share_evidence(
            "data wait", s.data_wait_share, wait_per_step, why.get("data_wait_share", ""), signal
        )
    )
    stall_per_step = signal.per_step_ms if signal.kind == "gpu" else None
    ev.append(
        _share_evidence(
            "GPU input stall",
            s.gpu_stall_share,
            stall_per_step,
            why.get("gpu_stall_share", ""),
            signal,
        )
    )
    if s.gpu_util_median_pct is None:
        ev.append(_unavailable("GPU utilisation", why.get("gpu_util_median_pct", "")))
    else:
        pct = s.gpu_util_median_pct
        ev.append(Evidence("GPU utilisation", pct, Finding("gpu-utilisation", {"pct": pct})))
    ev.append(_gpm_evidence(s))
    loader = m.loader
    if loader is None:
        ev.append(Evidence("DataLoader", None, Finding("no-loader")))
    else:
        facts = {"settings": loader_settings(loader), **role_of(loader)}
        ev.append(Evidence("DataLoader", float(loader.num_workers), Finding("loader", facts)))
    if m.cpus is None:
        ev.append(_unavailable("CPUs available", "the CPU count could not be read"))
    else:
        ev.append(Evidence("CPUs available", float(m.cpus), Finding("count", {"count": m.cpus})))
    ev.append(_worker_cpu(s, m))
    if s.process_cpu_median_pct is None:
        ev.append(_unavailable("main process CPU", why.get("process_cpu_median_pct", "")))
    else:
        pct = s.process_cpu_median_pct
        ev.append(Evidence("main process CPU", pct, Finding("process-cpu", {"pct": pct})))
    ev.append(_system_cpu(s, m))
    ev.extend(_clock_evidence(throttle, m))
    ev.append(_memory_evidence(s))
    if s.batch_size is None:
        ev.append(
            _unavailable(
                "batch size", "the batch size could not be counted or read from the batches"
            )
        )
    else:
        ev.append(Evidence("batch size", float(s.batch_size), _batch_size_finding(s, m)))
    return ev


def _batch_size_finding(s: Summary, m: Measurements) -> Finding:
    """The samples of a step; with the batches they came in, where a step is several of the
    training loader's batches (the optimizer steps of a trainer that accumulates gradients)."""
    size = s.batch_size or 0
    per_batch = m.loader.batch_size if m.loader is not None else None
    if per_batch and size > per_batch and size % per_batch == 0:
        batches = {"count": size, "batches": size // per_batch, "batch_size": per_batch}
        return Finding("samples-per-step", batches)
    return Finding("count", {"count": size})


def _gpm_evidence(s: Summary) -> Evidence:
    """SM activity (GPM), with the other GPM medians that were measured (percent; None: not
    measured)."""
    label = "SM activity"
    if s.sm_active_median_pct is None:
        return _unavailable(label, s.unavailable.get("sm_active_median_pct", ""))
    facts = {
        "pct": s.sm_active_median_pct,
        "occupancy_pct": s.sm_occupancy_median_pct,
        "tensor_pct": s.tensor_active_median_pct,
        "dram_bw_pct": s.dram_bw_median_pct,
    }
    return Evidence(label, s.sm_active_median_pct, Finding("sm-activity", facts))


def _system_cpu(s: Summary, m: Measurements) -> Evidence:
    label = "system CPU"
    if s.system_cpu_median_pct is None:
        return _unavailable(label, s.unavailable.get("system_cpu_median_pct", ""))
    busiest = m.host_readings["max_core_pct"].value
    facts = {"pct": s.system_cpu_median_pct, "busiest_core_pct": busiest}
    return Evidence(label, s.system_cpu_median_pct, Finding("system-cpu", facts))


def _worker_cpu(s: Summary, m: Measurements) -> Evidence:
    label = "worker CPU"
    if m.loader is not None and m.loader.num_workers == 0:
        return Evidence(label, None, Finding("no-workers", role_of(m.loader)))
    if s.workers_cpu_median_pct is None:
        return _unavailable(label, s.unavailable.get("workers_cpu_median_pct", ""))
    workers = m.host_readings["workers"].value
    if workers is None and m.loader is not None:
        workers = m.loader.num_workers
    facts = {"pct": s.workers_cpu_median_pct, "workers": workers}
    return Evidence(label, s.workers_cpu_median_pct, Finding("worker-cpu", facts))


def _clock_evidence(throttle: ThrottleFinding | None, m: Measurements) -> list[Evidence]:
    if throttle is None or not throttle.available:
        why = throttle.why if throttle is not None else m.gpu.median("sm_clock_mhz").why
        return [_unavailable("SM clock", why), _unavailable("throttling", why)]
    out = []
    if throttle.clock_ratio_median is None:
        out.append(
            _unavailable("SM clock", m.gpu.median("sm_clock_mhz").why or "clock not reported")
        )
    else:
        facts: dict[str, Any] = {
            "mhz": throttle.clock_mhz_median,
            "max_mhz": throttle.clock_max_mhz,
            "ratio": throttle.clock_ratio_median,
        }
        out.append(Evidence("SM clock", throttle.clock_ratio_median, Finding("sm-clock", facts)))
    if not throttle.throttled_steps:
        out.append(Evidence("throttling", 0.0, Finding("no-throttling")))
    else:
        facts = {
            "share": throttle.share,
            "reasons": list(throttle.reasons),
            "slowdown": throttle.slowdown,
        }
        out.append(Evidence("throttling", throttle.share, Finding("throttled-steps", facts)))
    return out


def memory_share(s: Summary) -> float | None:
    """Peak GPU memory as a share of the device's memory."""
    if s.gpu_mem_peak_mb is None or not s.gpu_mem_total_mb:
        return None
    return s.gpu_mem_peak_mb / s.gpu_mem_total_mb


def _memory_evidence(s: Summary) -> Evidence:
    share = memory_share(s)
    if share is None:
        key = "gpu_mem_peak_mb" if s.gpu_mem_peak_mb is None else "gpu_mem_total_mb"
        return _unavailable("GPU memory", s.unavailable.get(key, "not measured"))
    facts = {"peak_mb": s.gpu_mem_peak_mb, "total_mb": s.gpu_mem_total_mb, "share": share}
    return Evidence("GPU memory", share, Finding("gpu-memory", facts))
