"""Memory a run record holds per training step, from a synthetic run driven through the tracer.

Each synthetic step is what a real loop produces: one DataLoader fetch (through
``StepTracer.wrap_next``, with a batch of two small tensors) and one ``optimizer.step()`` (through
``StepTracer.optimizer_hook()``, the run's global post-step hook). The tracer logs both and
processes its log into rows every ``PROCESS_EVENTS`` events, as a run without a live view does.
Each step writes one loader row, plus an optimizer row for the first few optimizer steps (until
the loader is known to fetch in step with them). No torch loader runs, which makes a million
steps take seconds.

Run on its own: ``.venv/bin/python benchmarks/memory.py [steps]``.
"""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from typing import Any

import torch

from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.record import RunRecord


class _SyntheticIterator:
    """What the tracer reads from a DataLoader iterator: its sampler and its yield count."""

    def __init__(self) -> None:
        self._index_sampler = object()
        self._num_yielded = 0
        self._num_workers = 0
        self._dataset = range(64)

    def next_batch(self) -> Any:
        self._num_yielded += 1
        return _BATCH


_BATCH = (torch.zeros(64, 8), torch.zeros(64, dtype=torch.long))


def _drive(steps: int) -> tuple[RunRecord, int]:
    """Run ``steps`` synthetic steps; returns the record and the ns spent in the tracer."""
    record = RunRecord()
    record.t0_ns = time.perf_counter_ns()
    tracer = StepTracer(record)
    it = _SyntheticIterator()
    optimizer = object()
    next_batch = _SyntheticIterator.next_batch
    fetch = tracer.wrap_next(next_batch)
    hook = tracer.optimizer_hook()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            fetch(it)
            hook(optimizer, (), {})
        spent = time.perf_counter_ns() - t0
        t1 = time.perf_counter_ns()
        for _ in range(steps):
            next_batch(it)
        spent -= time.perf_counter_ns() - t1  # the synthetic loader's own cost
    finally:
        gc.enable()
    tracer.close()
    return record, spent


def memory_per_step(steps: int = 1_000_000, heap_steps: int = 100_000) -> dict[str, Any]:
    """Bytes per step held by the run record.

    ``bytes_per_step``: ``RunRecord.nbytes / steps`` after ``steps`` synthetic steps.
    ``heap_bytes_per_step``: Python heap growth per step (``tracemalloc``) over
    ``min(steps, heap_steps)`` steps: the record plus anything else the tracer keeps.
    ``tracer_us_per_step``: host time of the tracer's two calls per step, segmenting the log
    included, warm, microseconds.
    """
    record, spent_ns = _drive(steps)
    heap_n = min(steps, heap_steps)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        heap_record, _ = _drive(heap_n)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del heap_record
    return {
        "steps": steps,
        "rows": len(record.steps),
        "record_mb": record.nbytes / 1e6,
        "bytes_per_step": record.nbytes / steps,
        "heap_steps": heap_n,
        "heap_bytes_per_step": grown / heap_n,
        "tracer_us_per_step": spent_ns / steps / 1e3,
    }


if __name__ == "__main__":
    n = int(float(sys.argv[1])) if len(sys.argv) > 1 else 1_000_000
    result = memory_per_step(n)
    for key, value in result.items():
        print(f"{key:>20}: {value:,.2f}" if isinstance(value, float) else f"{key:>20}: {value:,}")
