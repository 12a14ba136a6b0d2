"""Which NVML device is CUDA device *i*, and what PyTorch says about it.

:func:`match_cuda_device` is a pure function of what NVML lists and what CUDA says (UUID, PCI
bus id, ``CUDA_VISIBLE_DEVICES``), so ``CUDA_VISIBLE_DEVICES`` reordering and MIG instances map
right; :func:`torch_device_ids` and :func:`torch_allocator_reader` read PyTorch's side.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import nvml_binding as nb


@dataclass(frozen=True)
class NvmlDevice:
    """One device NVML lists: a physical GPU, or a MIG instance on one (``mig_index`` set)."""

    index: int  #: NVML index of the physical GPU
    uuid: str  #: as NVML writes it: ``GPU-…`` or ``MIG-…``
    pci_bus_id: str | None = None
    mig_index: int | None = None
    mig_enabled: bool = False  #: MIG mode is on (for an instance: on its GPU)
    name: str = ""

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None

    @property
    def label(self) -> str:
        where = f"GPU {self.index}" + (f" MIG {self.mig_index}" if self.is_mig else "")
        return f"{where} ({self.name})" if self.name else where


@dataclass(frozen=True)
class CudaDeviceIds:
    """What PyTorch says about a CUDA device (``None`` where it does not say)."""

    uuid: str | None = None  #: ``torch.cuda.get_device_properties(i).uuid``, no prefix
    pci_bus_id: str | None = None  #: ``domain:bus:device.0`` from the same properties


@dataclass(frozen=True)
class DeviceMatch:
    device: NvmlDevice
    method: str  #: "uuid", "pci_bus_id", "CUDA_VISIBLE_DEVICES", "only GPU" or "position"
    note: str = ""  #: a caveat for the capabilities notes ('' when the match is certain)


_HEX = re.compile(r"[^0-9a-f]")


def normalise_uuid(value: str) -> str:
    """A UUID reduced to its hex digits: ``GPU-``/``MIG-`` prefix, dashes and case dropped."""
    text = value.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return _HEX.sub("", text)


def parse_pci_bus_id(value: str | None) -> tuple[int, int, int] | None:
    """``(domain, bus, device)`` from ``0000:01:00.0`` or NVML's ``00000000:01:00.0``."""
    if not value:
        return None
    m = re.fullmatch(
        r"\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?\s*", value
    )
    if m is None:
        return None
    domain, bus, device = m.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16)


def _match_visible_token(token: str, devices: list[NvmlDevice]) -> NvmlDevice | None:
    gpus = [d for d in devices if not d.is_mig]
    if re.fullmatch(r"\d+", token):
        found = [d for d in gpus if d.index == int(token)]
        return found[0] if found else None
    low = token.lower()
    if low.startswith("gpu-"):
        pool, prefix = gpus, normalise_uuid(token)
    elif low.startswith("mig-") and "/" not in token:
        pool, prefix = [d for d in devices if d.is_mig], normalise_uuid(token)
    else:  # legacy "MIG-GPU-<uuid>/<gi>/<ci>" or anything CUDA would reject
        return None
    if not prefix:
        return None
    found = [d for d in pool if normalise_uuid(d.uuid).startswith(prefix)]
    return found[0] if len(found) == 1 else None


def match_cuda_device(
    cuda_index: int,
    ids: CudaDeviceIds,
    devices: list[NvmlDevice],
    visible_devices: str | None,
    device_order: str | None = None,
) -> DeviceMatch | None:
    """Which NVML device CUDA device ``cuda_index`` (as PyTorch numbers it) is, and how we know.

    Tried in order: the UUID PyTorch reports (also MIG instances); its PCI bus id; the
    ``cuda_index``-th entry of ``CUDA_VISIBLE_DEVICES`` (integers, ``GPU-``/``MIG-`` UUID
    prefixes; CUDA ignores the list from the first entry it cannot use); the only GPU there
    is; the NVML device with the same index (the position — a guess, said in ``note``).
    ``None`` when none of these can be trusted.
    """
    if ids.uuid:
        want = normalise_uuid(ids.uuid)
        for dev in devices:
            if want and normalise_uuid(dev.uuid) == want:
                return DeviceMatch(dev, "uuid")
    pci = parse_pci_bus_id(ids.pci_bus_id)
    if pci is not None:
        for dev in devices:
            if not dev.is_mig and parse_pci_bus_id(dev.pci_bus_id) == pci:
                note = ""
                if dev.mig_enabled:
                    note = (
                        f"cuda:{cuda_index} is a MIG instance of {dev.label} that could not be "
                        "identified: NVML memory figures are for the whole GPU"
                    )
                return DeviceMatch(dev, "pci_bus_id", note)
    gpus = [d for d in devices if not d.is_mig]
    if visible_devices is not None:
        tokens = [t.strip() for t in visible_devices.split(",")]
        resolved: list[NvmlDevice] = []
        for token in tokens[: cuda_index + 1]:
            visible = _match_visible_token(token, devices)
            if visible is None:
                break
            resolved.append(visible)
        if len(resolved) == cuda_index + 1:
            chosen = resolved[-1]
            note = ""
            if tokens[cuda_index].isdigit() and device_order != "PCI_BUS_ID" and len(gpus) > 1:
                note = (
                    f"cuda:{cuda_index} was matched to NVML {chosen.label} through "
                    f"CUDA_VISIBLE_DEVICES={visible_devices!r}, which assumes CUDA numbers GPUs "
                    "like NVML does (set CUDA_DEVICE_ORDER=PCI_BUS_ID to be sure)"
                )
            return DeviceMatch(chosen, "CUDA_VISIBLE_DEVICES", note)
    if len(gpus) == 1 and len(devices) == 1:
        return DeviceMatch(gpus[0], "only GPU")
    if visible_devices is None:
        found = [d for d in gpus if d.index == cuda_index]
        if found:
            note = (
                f"cuda:{cuda_index} could not be identified (no UUID or PCI bus id from PyTorch, "
                f"CUDA_VISIBLE_DEVICES unset): assumed to be NVML {found[0].label} by position"
            )
            return DeviceMatch(found[0], "position", note)
    return None


def list_nvml_devices(nvml: Any) -> tuple[list[NvmlDevice], dict[NvmlDevice, Any]]:
    """Every GPU NVML sees and, on MIG-enabled GPUs, every MIG instance, with their handles."""
    devices: list[NvmlDevice] = []
    handles: dict[NvmlDevice, Any] = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            pci: str | None = nb.pci_bus_id(nvml, handle)
        except Exception as exc:
            if not nb.is_nvml_error(nvml, exc) or nb.classify(exc) == nb.LOST:
                raise
            pci = None
        try:
            label = nb.name(nvml, handle)
        except Exception:
            label = ""
        mig = nb.mig_enabled(nvml, handle)
        gpu = NvmlDevice(index, nb.uuid(nvml, handle), pci, None, mig, label)
        devices.append(gpu)
        handles[gpu] = handle
        if mig:
            for mig_index, mig_handle in nb.mig_handles(nvml, handle):
                inst = NvmlDevice(index, nb.uuid(nvml, mig_handle), pci, mig_index, True, label)
                devices.append(inst)
                handles[inst] = mig_handle
    return devices, handles


# --- PyTorch's side ---------------------------------------------------------------------------


def _torch_cuda() -> Any:
    """``torch.cuda`` when CUDA is usable in this process, else None."""
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:
        return None


def torch_device_ids(cuda_index: int) -> CudaDeviceIds:
    """UUID and PCI bus id of a CUDA device from ``torch.cuda.get_device_properties``."""
    cuda = _torch_cuda()
    if cuda is None:
        return CudaDeviceIds()
    try:
        props = cuda.get_device_properties(cuda_index)
    except Exception:
        return CudaDeviceIds()
    return device_ids_of(props)


def device_ids_of(props: Any) -> CudaDeviceIds:
    """UUID and PCI bus id from a ``torch.cuda.get_device_properties`` result."""
    raw_uuid = getattr(props, "uuid", None)
    uuid = str(raw_uuid) if raw_uuid is not None else None
    pci = None
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        domain = getattr(props, "pci_domain_id", 0) or 0
        device = getattr(props, "pci_device_id", 0) or 0
        pci = f"{domain:04x}:{bus:02x}:{device:02x}.0"
    return CudaDeviceIds(uuid or None, pci)


AllocatorReader = Callable[[], tuple[float, float, float]]


def torch_allocator_reader(cuda_index: int) -> AllocatorReader | None:
    """A function giving ``(allocated, reserved, peak)`` MiB of PyTorch's caching allocator on
    ``cuda_index``, or None when CUDA is not usable (a CPU build would answer 0 for them).

    Meant for the sampler thread: these calls read counters under the allocator's lock and
    never synchronise the device.
    """
    cuda = _torch_cuda()
    if cuda is None:
        return None

    def read() -> tuple[float, float, float]:
        # one call for the three numbers: memory_allocated() & co. each flatten and sort the
        # whole statistics dict
        stats = cuda.memory_stats_as_nested_dict(cuda_index)
        if not stats:  # CUDA not initialised yet in this process: PyTorch holds nothing
            return 0.0, 0.0, 0.0
        allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
        return (
            allocated["current"] / nb.MIB,
            reserved["current"] / nb.MIB,
            allocated["peak"] / nb.MIB,
        )

    return read
