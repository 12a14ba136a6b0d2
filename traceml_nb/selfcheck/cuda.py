"""CUDA helpers the checks share: torch, imported only when a check runs; GPU time between
CUDA events; a calibrated GPU spin (``torch.cuda._sleep``) that keeps the GPU busy for a
known time without the host taking part; and the host time of each CUDA call the tracer makes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def torch_module() -> Any:
    """``torch``, imported here so that importing the self-check does not load it."""
    import torch

    return torch


def elapsed_ms(torch: Any, work: Callable[[], None]) -> float:
    """GPU time of ``work`` between two CUDA events (waits for the second: calibration only)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


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


def busy_gpu(torch: Any, ms: float) -> None:
    """Queue ``ms`` of GPU spinning (asynchronous)."""
    rate = spin_cycles_per_ms(torch)
    torch.cuda._sleep(int(ms * rate))


def cuda_call_costs_us(
    torch: Any, n: int = 2000, clock: Callable[[], int] = time.perf_counter_ns
) -> dict[str, float]:
    """Host time of each CUDA call the tracer makes, us a call (the mean of ``n`` in a row, the
    GPU idle, on ``clock``, ns): ``current_stream`` (an iterator's stream look-up),
    ``new_event_record_free`` (an event made, recorded and freed: a cold pool),
    ``record_reused_event`` (a pooled event recorded: twice a fetch), ``query`` and
    ``elapsed_time`` (resolving a step)."""
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
        t0 = clock()
        for _ in range(n):
            call()
        costs[name] = (clock() - t0) / n / 1e3
        torch.cuda.synchronize()
        if name == "record_reused_event":
            done_b.record(stream)
            torch.cuda.synchronize()
    return costs
