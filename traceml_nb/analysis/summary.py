"""Steady-state statistics of a run: the :class:`Summary`, and the measurements behind it that the
diagnosis reads (:class:`Measurements`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.capabilities import Capabilities
from ..engine.flop_capture import FlopCount
from ..engine.optimizer_info import OptimizerInfo
from ..engine.record import (
    FLAG_EPOCH_START,
    FLAG_FLOP_COUNTED,
    FLAG_INTERLEAVED,
    FLAG_OPTIMIZER_STEP,
    FLAG_PROFILED,
    LoaderInfo,
    RecordSnapshot,
)
from ..engine.step_table import PhaseRows, StepColumns
from .findings import Summary
from .input_sizes import InputSizes, input_sizes
from .peak_flops import utilisation
from .samples import Reading, Window
from .step_anatomy import MEDIAN_FIELDS, NO_COPY, step_anatomy
from .step_blocks import block_means, block_steps
from .steps import StepSelection, began_inside, phases, select_rows, training_loader
from .warmup import WarmupSpec, detect_warmup

NO_STEPS = "no steady steps yet"
NO_LOADER = "no DataLoader was iterated: data loading outside a torch DataLoader is not measured"
MARKER_STALLS = (
    "GPU input stalls are measured per DataLoader batch, and these steps are not batches"
)
#: Summary field -> the GPU table's GPM column it is the steady median of.
GPM_READINGS = {
    "sm_active_median_pct": "sm_active_pct",
    "sm_occupancy_median_pct": "sm_occupancy_pct",
    "tensor_active_median_pct": "tensor_active_pct",
    "dram_bw_median_pct": "dram_bw_pct",
}


@dataclass
class Measurements:
    """Everything the diagnosis needs beyond the :class:`Summary` (not serialised)."""

    columns: StepColumns  #: the snapshot of every step row the analysis worked on
    selection: StepSelection
    warmup: int  #: leading steps excluded
    warmup_index: np.ndarray  #: indices (in ``selection``) of the warm-up steps
    steady_index: np.ndarray  #: ...and of the steady steps
    interleaved: int  #: steps an evaluation ran inside, left out of the statistics
    profiled: int  #: steps that ran under the profiler (``--profile``), left out too
    flop_counted: int  #: steps the FLOP count slowed, left out too
    wall_ms: np.ndarray  #: steady steps
    wait_ms: np.ndarray
    stall_ms: np.ndarray  #: GPU input stall, NaN where unresolved
    span_ms: np.ndarray  #: GPU time from the batch's arrival to the next fetch, NaN likewise
    #: input copy, forward, backward and optimizer time (``step_anatomy.PHASES``), ms, of the
    #: steady steps that have them (positions among the steady steps)
    phase_ms: PhaseRows
    gpu_phase_ms: PhaseRows  #: the same phases on the GPU timeline (CUDA events)
    start_s: np.ndarray
    flags: np.ndarray
    host: Window
    gpu: Window
    gpu_index: int | None
    gpu_in_use: bool
    loader: LoaderInfo | None
    optimizers: tuple[OptimizerInfo, ...]  #: the optimizers that stepped, first step first
    #: ``(outer, inner)`` phases that started inside another (``RunRecord.phases_inside``)
    phases_inside: tuple[tuple[str, str], ...]
    cpus: int | None
    elapsed_s: float
    run_wait_s: float  #: data wait of every measured step, warm-up included
    run_stall_s: float | None  #: GPU input stall of every measured step (None: unavailable)
    gpu_stall_why: str  #: why the GPU input stall is unavailable ('' when available)
    host_readings: dict[str, Reading]
    gpu_util: Reading
    mem_peak: Reading
    mem_total: Reading
    #: GPM medians over the steady steps, by column (``GPM_READINGS``)
    gpm: dict[str, Reading]

    @property
    def steady(self) -> int:
        return len(self.wall_ms)

    def epoch_ids(self) -> np.ndarray:
        """Epoch number of each steady step (0 = the epoch the steady steps started in)."""
        return np.cumsum((self.flags & FLAG_EPOCH_START) != 0) - int(
            (self.flags[:1] & FLAG_EPOCH_START).any()
        )


def resolve_cpus(cpus_available: int | None, host: Window) -> int | None:
    """CPUs this process may use: the argument, else the host sampler's, else the affinity mask."""
    if cpus_available is not None:
        return int(cpus_available)
    sampled = host.values("cpus_available", whole_run=True)
    if len(sampled):
        return int(np.median(sampled))
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _elapsed_s(snapshot: RecordSnapshot, steps: StepColumns) -> float:
    """The run's duration; while it runs, up to the end of its last step row."""
    if snapshot.ended:
        return snapshot.elapsed_ns / 1e9
    if not len(steps):
        return 0.0
    ends = np.frombuffer(steps.start_ns, "i8") + np.frombuffer(steps.wall_ns, "i8")
    return float(ends.max()) / 1e9


def _gpu_stall_why(capabilities: Capabilities, sel: StepSelection, stall: np.ndarray) -> str:
    if not capabilities.ok("gpu_events"):
        return capabilities.why("gpu_events")
    if sel.source in ("marker", "optimizer"):
        return MARKER_STALLS
    if not np.isfinite(stall).any():
        return "no GPU input stall was resolved yet"
    return ""


def _rows_of(index: np.ndarray) -> slice | np.ndarray:
    """``index`` (ascending row numbers) as a slice where the rows are consecutive, as the
    steady steps mostly are: the steady columns are then views of the selection's, not a copy
    of each (40 bytes a step, in a run of a million steps 40 MB at once)."""
    if len(index) and int(index[-1]) - int(index[0]) + 1 == len(index):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def measure(
    snapshot: RecordSnapshot,
    capabilities: Capabilities,
    warmup: WarmupSpec = "auto",
    cpus_available: int | None = None,
) -> Measurements:
    """Select the steps, exclude the warm-up and read the samplers over the steady window."""
    cols = snapshot.steps
    sel = select_rows(snapshot)
    # a step an evaluation ran inside is a step, but its time is the evaluation's too; a
    # profiled step's time is the profiler's too
    eligible = (sel.flags & (FLAG_INTERLEAVED | FLAG_PROFILED | FLAG_FLOP_COUNTED)) == 0
    index = np.flatnonzero(eligible)
    n_warm = detect_warmup(sel.wall_ms[index], warmup)
    steady = index[n_warm:]
    rows = _rows_of(steady)
    start_s = sel.start_s[rows]
    wall = sel.wall_ms[rows]
    if len(wall):
        t0, t1 = float(start_s[0]), float((start_s + wall / 1e3).max())
    else:
        t0, t1 = np.inf, -np.inf
    gpu_index = min(snapshot.gpus) if snapshot.gpus else None
    host = Window(snapshot.host, t0, t1, capabilities, "host")
    gpu = Window(
        snapshot.gpus.get(gpu_index) if gpu_index is not None else None, t0, t1, capabilities, "gpu"
    )
    stall = sel.gpu_stall_ms[rows]
    stall_why = _gpu_stall_why(capabilities, sel, stall)
    all_stall = sel.gpu_stall_ms[eligible]
    host_readings = {
        name: host.median(name)
        for name in (
            "proc_cpu_pct",
            "workers_cpu_pct",
            "workers_cpu_wait_pct",
            "sys_cpu_pct",
            "max_core_pct",
            "cores_saturated",
        )
    }
    host_readings["workers"] = host.median_beside("workers", "workers_cpu_pct")
    host_readings["steal_pct"] = host.mean("steal_pct")  # a share of time: its mean
    mem_peak = gpu.peak("mem_used_mb")
    if mem_peak.value is None:
        torch_peak = gpu.peak("torch_peak_mb")
        if torch_peak.value is not None:
            mem_peak = torch_peak
    return Measurements(
        columns=cols,
        selection=sel,
        warmup=n_warm,
        warmup_index=index[:n_warm],
        steady_index=steady,
        interleaved=int(((sel.flags & FLAG_INTERLEAVED) != 0).sum()),
        profiled=int(((sel.flags & (FLAG_INTERLEAVED | FLAG_PROFILED)) == FLAG_PROFILED).sum()),
        flop_counted=int(
            (
                (sel.flags & (FLAG_INTERLEAVED | FLAG_PROFILED | FLAG_FLOP_COUNTED))
                == FLAG_FLOP_COUNTED
            ).sum()
        ),
        wall_ms=wall,
        wait_ms=sel.wait_ms[rows],
        stall_ms=stall,
        span_ms=sel.gpu_span_ms[rows],
        phase_ms=sel.phase_ms.take(steady),
        gpu_phase_ms=sel.gpu_phase_ms.take(steady),
        start_s=start_s,
        flags=sel.flags[rows],
        host=host,
        gpu=gpu,
        gpu_index=gpu_index,
        gpu_in_use=capabilities.ok("gpu_events") or bool(snapshot.gpus),
        loader=training_loader(snapshot, sel),
        optimizers=snapshot.optimizers,
        phases_inside=snapshot.phases_inside,
        cpus=resolve_cpus(cpus_available, host),
        elapsed_s=_elapsed_s(snapshot, cols),
        run_wait_s=float(sel.wait_ms[eligible].sum()) / 1e3,
        run_stall_s=None if stall_why else float(np.nansum(all_stall)) / 1e3,
        gpu_stall_why=stall_why,
        host_readings=host_readings,
        gpu_util=gpu.median("util_gpu_pct"),
        mem_peak=mem_peak,
        mem_total=gpu.peak("mem_total_mb"),
        gpm={key: gpu.median(column) for key, column in GPM_READINGS.items()},
    )


def _share(part: np.ndarray, whole: np.ndarray) -> float | None:
    total = float(whole.sum())
    return float(part.sum()) / total if total > 0 else None


def gpu_stall_share(m: Measurements) -> float | None:
    """Sum of GPU input stall / sum of step time, over the steady steps whose stall resolved."""
    if m.gpu_stall_why:
        return None
    ok = np.isfinite(m.stall_ms)
    return _share(m.stall_ms[ok], m.wall_ms[ok])


def _batch_size(m: Measurements, batches: np.ndarray) -> int | None:
    known = batches[batches >= 0]
    if len(known):
        return int(np.median(known))
    if m.loader is not None and m.loader.batch_size:
        return int(m.loader.batch_size)
    return None


def _flop_figures(
    snapshot: RecordSnapshot, m: Measurements, unavailable: dict[str, str]
) -> dict[str, Any]:
    """The FLOPs per step (the count over the steps that began inside it, divided by them;
    where the batches differ in size, taken in proportion to their elements: :mod:`.input_sizes`),
    their shares by precision, the FLOP/s they make over the median
    rest of the steady steps (the step less its data wait; on a GPU its span on the GPU
    timeline, from the batch's arrival to the next fetch, where resolved), the MFU and the peak
    it is against (:mod:`.peak_flops`); each missing one with why in ``unavailable``."""
    count = snapshot.flops
    window = 0
    flops, why = None, "the run counted no FLOPs"
    counted_ns = count.count_window_ns if count is not None else None
    if count is not None and count.flops is not None and counted_ns is not None:
        window = int(began_inside(m.selection, counted_ns).sum())
        flops = float(count.flops) / max(1, window)  # accumulation: a count over its cycle
    elif count is not None:
        why = count.why
    achieved = None
    sizes = None
    if flops is None:
        unavailable["flops_per_step"] = unavailable["achieved_tflops"] = why
    elif m.steady:
        since = _counted_since(count, m)
        spans = since & np.isfinite(m.span_ms) if m.gpu_in_use else np.zeros_like(since)
        on_gpu = bool(spans.any())
        timed = spans if on_gpu else since
        times_ms = (m.span_ms if on_gpu else m.wall_ms - m.wait_ms)[timed]
        sizes = _input_sizes(m, window, counted_ns, since)
        if sizes is not None:  # each step's FLOPs over its time
            work = sizes.work(flops, m.selection.elements[m.steady_index][timed])
            rates = work[times_ms > 0] / (times_ms[times_ms > 0] / 1e3)
            achieved = float(np.median(rates)) / 1e12 if len(rates) else None
            flops *= sizes.factor
        else:
            compute_ms = float(np.median(times_ms)) if len(times_ms) else 0.0
            achieved = flops / (compute_ms / 1e3) / 1e12 if compute_ms > 0 else None
    if achieved is None and "achieved_tflops" not in unavailable:
        unavailable["achieved_tflops"] = NO_STEPS
    figures: dict[str, Any] = {
        "flops_per_step": flops,
        "flops_since_step": _since_step(count, m) if flops is not None else None,
        "achieved_tflops": achieved,
        "flop_window_steps": window if flops is not None else 0,
    }
    if flops is not None and count is not None:
        factor = sizes.factor if sizes is not None else 1.0
        figures["recomputed_flops_per_step"] = count.recomputed_flops / max(1, window) * factor
        figures["outside_flops_per_step"] = count.outside_flops / max(1, window) * factor
        if sizes is not None:
            figures["flop_input_elements"] = [sizes.counted, sizes.mean, sizes.least, sizes.most]
        figures["uncounted_ops"] = list(count.uncounted_ops)
        figures["uncounted_outside_ops"] = list(count.uncounted_outside_ops)
    if count is not None and count.by_dtype:
        total = sum(count.by_dtype.values())
        figures["flop_precisions"] = {k: v / total for k, v in count.by_dtype.items()}
        figures["flop_device"] = count.device or None
        figures["conv_share"] = count.conv_flops / total
        if count.conv_flops:
            figures["channels_last_share"] = count.channels_last_flops / count.conv_flops
    if achieved is None:
        unavailable["mfu"] = unavailable["achieved_tflops"]
        return figures
    found = utilisation(count.by_dtype if count else {}, count.device if count else "", achieved)
    if found.mfu is None:
        unavailable["mfu"] = found.why
    figures.update(mfu=found.mfu, mfu_peak_tflops=found.peak_tflops)
    return figures


def _counted_since(count: FlopCount | None, m: Measurements) -> np.ndarray:
    """Which steady steps the count stands for: all, or where it was counted again after the
    trained parameters changed, those that began since."""
    if count is None or count.since_ns is None:
        return np.ones(len(m.wall_ms), dtype=bool)
    return np.asarray(m.start_s * 1e9 >= count.since_ns)


def _input_sizes(
    m: Measurements, window: int, counted_ns: tuple[int, int] | None, since: np.ndarray
) -> InputSizes | None:
    """The sizes of the batches of the count's steps and of the steady steps it stands for,
    where they differ in their samples' size (:mod:`.input_sizes`)."""
    sel = m.selection
    if not window or counted_ns is None or len(sel.elements) != len(sel.wall_ms):
        return None
    steady = m.steady_index[since]
    return input_sizes(
        sel.elements[began_inside(sel, counted_ns)], sel.elements[steady], sel.batch[steady]
    )


def _since_step(count: FlopCount | None, m: Measurements) -> int | None:
    """The step (from 1) from which a count made again stands (None: the whole run's)."""
    if count is None or count.since_ns is None:
        return None
    return int((m.selection.start_s * 1e9 < count.since_ns).sum()) + 1


def summarize(snapshot: RecordSnapshot, m: Measurements) -> Summary:
    """The :class:`Summary` of ``snapshot`` from its measurements."""
    sel = m.selection
    wall, wait = m.wall_ms, m.wait_ms
    unavailable: dict[str, str] = {}
    n = m.steady
    has_loader = bool(snapshot.loaders)
    batches = sel.batch[m.steady_index]
    batch_size = _batch_size(m, batches)
    total_s = float(wall.sum()) / 1e3
    steps_per_s = n / total_s if n and total_s > 0 else None
    samples_per_s: float | None = None
    if n and total_s > 0:
        if len(batches) and (batches >= 0).all():
            samples_per_s = float(batches.sum()) / total_s
        elif batch_size is not None and steps_per_s is not None:
            samples_per_s = batch_size * steps_per_s
    if not n:
        for key in ("step_ms_median", "data_wait_share", "samples_per_s"):
            unavailable[key] = NO_STEPS
    elif samples_per_s is None:
        unavailable["samples_per_s"] = (
            "the batch size could not be counted or read from the batches"
        )
    if not has_loader:
        unavailable["data_wait_share"] = NO_LOADER
    stall_share = gpu_stall_share(m) if n else None
    if stall_share is None:
        unavailable["gpu_stall_share"] = m.gpu_stall_why or NO_STEPS

    def reading(key: str, r: Reading) -> float | None:
        if r.value is None:
            unavailable[key] = r.why
        return r.value

    first_fetch = None
    if snapshot.first_fetch_wait_ns:
        slot = m.loader.slot if m.loader is not None else min(snapshot.first_fetch_wait_ns)
        ns = snapshot.first_fetch_wait_ns.get(slot)
        first_fetch = ns / 1e6 if ns is not None else None
    if first_fetch is None:
        unavailable["first_fetch_ms"] = NO_LOADER

    if m.loader is not None and m.loader.num_workers == 0:
        workers_cpu = None  # not a 0% reading: there is nothing to read
        unavailable["workers_cpu_median_pct"] = (
            "no DataLoader workers, num_workers=0: batches are loaded in the main process"
        )
    else:
        workers_cpu = reading("workers_cpu_median_pct", m.host_readings["workers_cpu_pct"])

    on_gpu = m.gpu_in_use
    anatomy = step_anatomy(
        wall,
        wait,
        m.phase_ms,
        stepped=(m.flags & FLAG_OPTIMIZER_STEP) != 0,
        gpu=(m.gpu_phase_ms, m.stall_ms, m.span_ms) if on_gpu else None,
        inside=m.phases_inside,
    )
    medians: dict[str, Any] = {
        name: anatomy.medians_ms.get(part) for part, name in MEDIAN_FIELDS.items()
    }
    for part, name in MEDIAN_FIELDS.items():
        if part not in anatomy.medians_ms:
            unavailable[name] = anatomy.unavailable.get(part, anatomy.why) if n else NO_STEPS
    # steps told by optimizer steps, no loader training in them (an evaluation's aside)
    fetching = has_loader and (
        sel.source != "optimizer" or any(info.is_training for info in snapshot.loaders)
    )
    if not fetching and "copy" in anatomy.shares:  # never started, not measured at 0
        medians["copy_ms_median"] = None
        unavailable["copy_ms_median"] = NO_COPY
        anatomy.shares.pop("copy", None)
    # (with workers, over blocks of whole rounds of them: :mod:`.step_blocks`)
    block = block_steps(m.loader.num_workers if m.loader is not None else 0, n)
    walls, waits = block_means(wall, block), block_means(wait, block)
    median = p10 = p90 = mean = None
    if n:
        median, p10, p90 = (float(v) for v in np.percentile(walls, [50, 10, 90]))
        mean = float(wall.mean())
    loader_stats = has_loader and n > 0
    return Summary(
        step_source=sel.source,
        total_steps=len(sel),
        warmup_steps=m.warmup,
        steady_steps=n,
        interleaved_steps=m.interleaved,
        profiled_steps=m.profiled,
        flop_counted_steps=m.flop_counted,
        **_flop_figures(snapshot, m, unavailable),
        elapsed_s=m.elapsed_s,
        warmup_s=float(sel.wall_ms[m.warmup_index].sum()) / 1e3,
        step_ms_median=median,
        step_ms_p10=p10,
        step_ms_p90=p90,
        step_ms_mean=mean,
        step_block=block,
        data_wait_ms_median=float(np.median(waits)) if loader_stats else None,
        compute_ms_median=float(np.median(walls - waits)) if loader_stats else None,
        data_wait_share=_share(wait, wall) if loader_stats else None,
        first_fetch_ms=first_fetch,
        batch_size=batch_size,
        samples_per_s=samples_per_s,
        steps_per_s=steps_per_s,
        gpu_stall_share=stall_share,
        gpu_util_median_pct=reading("gpu_util_median_pct", m.gpu_util),
        gpu_mem_peak_mb=reading("gpu_mem_peak_mb", m.mem_peak),
        gpu_mem_total_mb=reading("gpu_mem_total_mb", m.mem_total),
        process_cpu_median_pct=reading("process_cpu_median_pct", m.host_readings["proc_cpu_pct"]),
        workers_cpu_median_pct=workers_cpu,
        system_cpu_median_pct=reading("system_cpu_median_pct", m.host_readings["sys_cpu_pct"]),
        cpus_available=m.cpus,
        phases=phases(snapshot, sel),
        steal_mean_pct=reading("steal_mean_pct", m.host_readings["steal_pct"]),
        sm_active_median_pct=reading("sm_active_median_pct", m.gpm["sm_active_median_pct"]),
        sm_occupancy_median_pct=reading(
            "sm_occupancy_median_pct", m.gpm["sm_occupancy_median_pct"]
        ),
        tensor_active_median_pct=reading(
            "tensor_active_median_pct", m.gpm["tensor_active_median_pct"]
        ),
        dram_bw_median_pct=reading("dram_bw_median_pct", m.gpm["dram_bw_median_pct"]),
        unavailable=unavailable,
        phase_shares=anatomy.shares,
        occasional_phases={k: list(v) for k, v in anatomy.occasional.items()},
        phases_on_gpu=on_gpu and bool(anatomy.shares),
        **medians,
    )
