"""CUDA helpers the checks share: torch, imported only when a check runs; GPU time between
CUDA events; and a calibrated GPU spin (``torch.cuda._sleep``) that keeps the GPU busy for a
known time without the host taking part."""

from __future__ import annotations

import statistics
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
