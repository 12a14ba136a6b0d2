"""Hand-built run records, for tests of the analysis and the renderers without torch or a GPU.

::

    b = RecordBuilder()
    b.loader(num_workers=0, batch_size=8)
    b.steps(200, wall_ms=30.0, wait_ms=18.0)
    b.samples("host", proc_cpu_pct=100.0, sys_cpu_pct=60.0)
    record, caps = b.finish(), cpu_capabilities()

Values given to :meth:`RecordBuilder.steps` and :meth:`RecordBuilder.samples` are scalars,
sequences (one value per step / sample) or functions of the index (steps) or time (samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from traceml_nb.analysis.findings import PhaseSummary, Summary
from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.instrument.loader import IN_MEMORY_DATASETS
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.record import (
    FLAG_EPOCH_START,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    LoaderInfo,
    RunRecord,
    SampleTable,
)
from traceml_nb.engine.run import NO_CUDA

Values = float | int | Sequence[float] | np.ndarray | Callable[[Any], Any] | None

CPU_ONLY = NO_CUDA


def _spread(values: Values, n: int, index: np.ndarray) -> np.ndarray:
    if values is None:
        return np.full(n, np.nan)
    if callable(values):
        return np.array([values(i) for i in index], dtype=float)
    arr = np.asarray(values, dtype=float)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    if len(arr) != n:
        raise ValueError(f"expected {n} values, got {len(arr)}")
    return arr


class RecordBuilder:
    """Builds a :class:`RunRecord` step by step on a virtual clock (starting at 0)."""

    def __init__(self) -> None:
        self.record = RunRecord()
        self.t_ns = 0  #: the virtual clock, ns since the run start
        self._training: set[int] = set()  #: slots whose batches are followed by optimizer steps

    def loader(
        self,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        batch_size: int | None = 8,
        training: bool = True,
        dataset_type: str = "TensorDataset",
        dataset_len: int | None = None,
    ) -> LoaderInfo:
        """Add a loader; a training loader gets optimizer steps counted as its batches arrive."""
        if prefetch_factor is None and num_workers > 0:
            prefetch_factor = 2  # what torch sets
        info = LoaderInfo(
            slot=len(self.record.loaders),
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            batch_size=batch_size,
            dataset_type=dataset_type,
            dataset_len=dataset_len,
            iterable=False,
            in_memory=dataset_type in IN_MEMORY_DATASETS,
        )
        if training:
            self._training.add(info.slot)
        self.record.loaders.append(info)
        return info

    def steps(
        self,
        count: int,
        wall_ms: Values,
        wait_ms: Values = 0.0,
        *,
        source: int = 0,
        batch: Values = 8,
        stall_ms: Values = None,
        flags: int = 0,
        epoch_len: int | None = None,
        leads: bool = True,
    ) -> None:
        """Append ``count`` consecutive steps of loader slot / ``SOURCE_*`` ``source``.

        ``epoch_len``: flag every ``epoch_len``-th step (from the first) as an epoch start.
        ``leads``: a training loader's fetches begin these steps (``LoaderInfo.leads``);
        ``False`` for a loader consumed alongside another (``zip``) or drawn inside its steps.
        """
        idx = np.arange(count)
        walls = _spread(wall_ms, count, idx)
        waits = _spread(wait_ms, count, idx)
        batches = _spread(batch, count, idx)
        stalls = _spread(stall_ms, count, idx)
        rec = self.record
        info = rec.loaders[source] if source < len(rec.loaders) else None
        for i in range(count):
            row_flags = flags
            if epoch_len and i % epoch_len == 0:
                row_flags |= FLAG_EPOCH_START
            wall_ns = int(round(walls[i] * 1e6))
            wait_ns = int(round(waits[i] * 1e6))
            if info is not None and info.fetches == 0:
                rec.first_fetch_wait_ns[source] = wait_ns
            row = rec.steps.append(self.t_ns, wall_ns, wait_ns, int(batches[i]), source, row_flags)
            if not math.isnan(stalls[i]):
                rec.steps.set_gpu(row, float(stalls[i]), math.nan)
            self.t_ns += wall_ns
            if info is not None:
                info.fetches += 1
                if row_flags & FLAG_EPOCH_START or info.epochs == 0:
                    info.epochs += 1
        if info is not None and source in self._training:
            info.optimizer_steps += count
            rec.optimizer_steps += count
            if leads:
                info.leads += count
        if source == SOURCE_MARKER:
            rec.markers += count
        elif source == SOURCE_OPTIMIZER:
            rec.optimizer_steps += count

    def pause(self, ms: float) -> None:
        """Advance the clock without a step (time outside the loop)."""
        self.t_ns += int(round(ms * 1e6))

    def samples(
        self, table: str, *, interval_s: float = 0.1, index: int = 0, **columns: Values
    ) -> SampleTable:
        """Sample ``columns`` every ``interval_s`` from 0 to now into the host table (``"host"``)
        or GPU ``index``'s table (``"gpu"``); callables receive the sample time in seconds."""
        end_s = self.t_ns / 1e9
        times = np.arange(0.0, end_s + interval_s / 2, interval_s)
        sample_table = SampleTable(list(columns), cap=max(20_000, len(times)))
        spread = {name: _spread(v, len(times), times) for name, v in columns.items()}
        for k, t in enumerate(times):
            sample_table.append(
                float(t),
                {name: None if np.isnan(v[k]) else float(v[k]) for name, v in spread.items()},
            )
        if table == "host":
            self.record.host = sample_table
        elif table == "gpu":
            self.record.gpus[index] = sample_table
        else:
            raise ValueError(f"table must be 'host' or 'gpu', got {table!r}")
        return sample_table

    def finish(self, tail_ms: float = 0.0) -> RunRecord:
        """End the run ``tail_ms`` after the last step and return the record."""
        self.pause(tail_ms)
        self.record.elapsed_ns = self.t_ns
        return self.record


def cpu_capabilities(host: bool = True) -> Capabilities:
    """What a CPU-only run with the host sampler reports."""
    caps = Capabilities()
    caps.set("steps", True)
    caps.set("data_wait", True)
    for name in ("gpu_events", "gpu_memory", "nvml", "gpu_utilisation"):
        caps.set(name, False, CPU_ONLY)
    caps.set("host", host, "" if host else "psutil is not installed")
    return caps


def gpu_capabilities(
    *, events: bool = True, nvml: bool = True, utilisation: bool = True
) -> Capabilities:
    """What a CUDA run reports; switch parts off to simulate their failure."""
    caps = Capabilities()
    for name in ("steps", "data_wait", "host", "gpu_memory"):
        caps.set(name, True)
    caps.set("gpu_events", events, "CUDA events failed")
    caps.set("nvml", nvml, "NVML library not found")
    caps.set("gpu_utilisation", nvml and utilisation, "utilisation is not supported on MIG devices")
    return caps


def make_summary(**changes) -> Summary:
    values: dict[str, Any] = dict(
        step_source="dataloader",
        total_steps=200,
        warmup_steps=5,
        steady_steps=195,
        elapsed_s=63.2,
        warmup_s=2.1,
        step_ms_median=316.0,
        step_ms_p10=301.0,
        step_ms_p90=342.0,
        step_ms_mean=318.0,
        data_wait_ms_median=139.0,
        compute_ms_median=177.0,
        data_wait_share=0.44,
        first_fetch_ms=1250.0,
        batch_size=64,
        samples_per_s=201.0,
        steps_per_s=3.14,
        gpu_stall_share=None,
        gpu_util_median_pct=None,
        gpu_mem_peak_mb=None,
        gpu_mem_total_mb=None,
        process_cpu_median_pct=98.0,
        workers_cpu_median_pct=None,
        system_cpu_median_pct=55.0,
        cpus_available=8,
        phases=[PhaseSummary("eval (loader 1)", 20, 3.5, 0.1)],
        copy_ms_median=3.2,
        forward_ms_median=52.0,
        backward_ms_median=98.0,
        optimizer_ms_median=14.0,
        other_ms_median=9.5,
        flops_per_step=3.1e9,
        achieved_tflops=0.0175,
        phase_shares={
            "data_wait": 0.44,
            "copy": 0.01,
            "forward": 0.17,
            "backward": 0.31,
            "optimizer": 0.04,
            "other": 0.03,
        },
        unavailable={
            "gpu_stall_share": CPU_ONLY,
            "gpu_util_median_pct": CPU_ONLY,
            "gpu_mem_peak_mb": CPU_ONLY,
            "workers_cpu_median_pct": "no DataLoader workers (num_workers=0)",
            "mfu": "no peak FLOP/s is known for a CPU",
        },
    )
    values.update(changes)
    return Summary(**values)


def processed(log: Sequence[tuple[Any, ...]], t_end_ns: int) -> RunRecord:
    """The record of a hand-built event log (:mod:`traceml_nb.engine.events`' tuples, as the
    instruments log them), processed by the tracer as a run does and closed at ``t_end_ns``
    (a little after); the processing raised nothing."""
    record = RunRecord()
    tracer = StepTracer(record, clock=lambda: t_end_ns + 20)
    tracer.log.extend(log)
    tracer.process()
    tracer.close()
    assert tracer.error is None, tracer.error
    return record
