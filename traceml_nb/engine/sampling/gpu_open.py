"""Opening the GPU sample sources of a run: NVML initialised once, each CUDA device the run uses
matched to its NVML device (a MIG instance to its parent for the fields only the parent has),
a :class:`~.gpu.GpuSource` for each, and the run's capabilities saying what each can measure and,
where nothing can, why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..capabilities import Capabilities
from . import nvml_binding as nb
from .collector import SourceLost
from .gpm import set_gpm_capabilities
from .gpu import PCIE_THROUGHPUT_PERIOD_S, GpuSource, NvmlSession
from .gpu_devices import (
    AllocatorReader,
    CudaDeviceIds,
    NvmlDevice,
    list_nvml_devices,
    match_cuda_device,
    torch_allocator_reader,
    torch_device_ids,
)


def _fail(capabilities: Capabilities, reason: str) -> None:
    capabilities.set("nvml", False, reason)
    capabilities.set("gpu_utilisation", False, reason)
    set_gpm_capabilities(capabilities, [], reason)


def open_gpu_sources(
    cuda_devices: list[int],
    capabilities: Capabilities,
    nvml: Any = None,
    *,
    device_ids: Callable[[int], CudaDeviceIds] = torch_device_ids,
    allocator: Callable[[int], AllocatorReader | None] = torch_allocator_reader,
    environ: Mapping[str, str] | None = None,
    pcie_throughput_period_s: float = PCIE_THROUGHPUT_PERIOD_S,
    clock: Callable[[], float] = time.monotonic,
) -> dict[int, GpuSource]:
    """One :class:`GpuSource` per CUDA device index, keyed by that index (``clock``: the
    seconds the read periods are counted in).

    ``nvml`` injects an NVML module (tests); by default ``pynvml`` is loaded. Every failure
    becomes a reason in ``capabilities`` ("nvml", "gpu_utilisation", "gpu_memory"): NVML
    missing, a device that cannot be identified, MIG. Where NVML fails but PyTorch's CUDA works
    the source still reads the allocator.
    """
    if not cuda_devices:
        if "nvml" not in capabilities.available:
            _fail(capabilities, "no CUDA device in this run")
        return {}
    env = os.environ if environ is None else environ
    module, nvml_reason = nb.start_nvml(nvml)
    session = NvmlSession(module) if module is not None else None
    sources: dict[int, GpuSource] = {}
    reasons: list[str] = []
    try:
        devices: list[NvmlDevice] = []
        handles: dict[NvmlDevice, Any] = {}
        if session is not None:
            try:
                devices, handles = list_nvml_devices(module)
            except Exception as exc:
                nvml_reason = f"NVML could not list the GPUs ({nb.error_text(exc)})"
                session.release()  # shuts NVML down
                session = None
        for index in cuda_devices:
            src = _open_one(
                index, capabilities, session, devices, handles, device_ids, allocator, env,
                pcie_throughput_period_s, reasons, clock,
            )  # fmt: skip
            if src is not None:
                sources[index] = src
    finally:
        if session is not None:  # shuts NVML down unless a source uses it
            session.release()
    _set_capabilities(capabilities, sources, nvml_reason, reasons)
    return sources


def _open_one(
    index: int,
    capabilities: Capabilities,
    session: NvmlSession | None,
    devices: list[NvmlDevice],
    handles: dict[NvmlDevice, Any],
    device_ids: Callable[[int], CudaDeviceIds],
    allocator: Callable[[int], AllocatorReader | None],
    env: Mapping[str, str],
    pcie_period: float,
    reasons: list[str],
    clock: Callable[[], float],
) -> GpuSource | None:
    reader = allocator(index)
    if session is None:
        return GpuSource(index, capabilities, allocator=reader) if reader is not None else None
    match = match_cuda_device(
        index,
        device_ids(index),
        devices,
        env.get("CUDA_VISIBLE_DEVICES"),
        env.get("CUDA_DEVICE_ORDER"),
    )
    if match is None:
        reasons.append(
            f"cuda:{index} could not be matched to an NVML device (no UUID/PCI id from PyTorch; "
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r})"
        )
        return GpuSource(index, capabilities, allocator=reader) if reader is not None else None
    if match.note:
        capabilities.note(match.note)
    handle = handles[match.device]
    parent = handle
    if match.device.is_mig:
        parent = handles[_parent_of(devices, match.device)]
    try:
        src = GpuSource(
            index, capabilities, session=session, device=match.device, handle=handle,
            parent_handle=parent, allocator=reader, pcie_throughput_period_s=pcie_period,
            clock=clock,
        )  # fmt: skip
    except SourceLost as exc:
        reasons.append(f"cuda:{index} ({match.device.label}): {exc}")
        return GpuSource(index, capabilities, allocator=reader) if reader is not None else None
    summary = src.unsupported_summary()
    if summary:
        capabilities.note(summary)
    return src


def _parent_of(devices: list[NvmlDevice], inst: NvmlDevice) -> NvmlDevice:
    """The physical GPU a MIG instance lives on."""
    return next(d for d in devices if d.index == inst.index and not d.is_mig)


def _set_capabilities(
    capabilities: Capabilities, sources: dict[int, GpuSource], nvml_reason: str, reasons: list[str]
) -> None:
    with_nvml = [s for s in sources.values() if s.has_nvml]
    if with_nvml:
        capabilities.set("nvml", True)
    else:
        capabilities.set(
            "nvml", False, nvml_reason or "; ".join(reasons) or "NVML is not available"
        )
    if any(s.has_utilisation for s in with_nvml):
        capabilities.set("gpu_utilisation", True)
    else:
        why = [f"{s.name}: {s.unsupported['utilisation']}" for s in with_nvml]
        capabilities.set("gpu_utilisation", False, "; ".join(why) or capabilities.why("nvml"))
    if any(s.has_memory for s in sources.values()):
        capabilities.set("gpu_memory", True)
    elif "gpu_memory" not in capabilities.available or capabilities.ok("gpu_memory"):
        capabilities.set("gpu_memory", False, capabilities.why("nvml"))
    readers = [s._gpm for s in with_nvml if s._gpm is not None]
    set_gpm_capabilities(capabilities, readers, capabilities.why("nvml"))
