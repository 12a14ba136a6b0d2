"""Samplers: GPU (NVML) and host (psutil) sources read by one background collector thread."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from ..capabilities import Capabilities
from ..record import RunRecord
from .collector import Collector, SampleSource, SourceLost

__all__ = ["Collector", "SampleSource", "SourceLost", "open_sources"]


def open_sources(
    record: RunRecord,
    capabilities: Capabilities,
    cuda_devices: list[int],
    *,
    nvml: Any = None,
    host: bool = True,
    gpu: bool = True,
    worker_pids: Container[int] | None = None,
) -> list[SampleSource]:
    """Open the sources a run needs and attach their tables to ``record``.

    ``nvml`` injects an NVML backend (tests); by default the real library is tried and every
    failure becomes a reason in ``capabilities``. ``worker_pids``: the DataLoader workers'
    process ids as the run learns them (:class:`~.host.HostSource`).
    """
    sources: list[SampleSource] = []
    if host:
        from .host import open_host_source

        host_source = open_host_source(capabilities, worker_pids)
        if host_source is not None:
            record.host = host_source.table
            sources.append(host_source)
    else:
        capabilities.set("host", False, "host sampling switched off")
    if gpu:
        from .gpu_open import open_gpu_sources

        for index, gpu_source in open_gpu_sources(cuda_devices, capabilities, nvml=nvml).items():
            record.gpus[index] = gpu_source.table
            sources.append(gpu_source)
    elif "nvml" not in capabilities.available:  # keep a reason the caller already gave
        capabilities.set("nvml", False, "GPU sampling switched off")
    return sources
