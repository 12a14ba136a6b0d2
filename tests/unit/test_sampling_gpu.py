"""The GPU sample source: NVML through a fake with the real pynvml exception classes, the real
NVML failure of this CPU machine, the CUDA→NVML device mapping, and the collector thread."""

from __future__ import annotations

import math
import statistics
import sys
import time

import pynvml
import pytest
import torch
from fake_nvml import FakeNvml, PcieCounter, make_gpus

from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.options import Backends
from traceml_nb.engine.sampling import Collector, SourceLost
from traceml_nb.engine.sampling import nvml_binding as nb
from traceml_nb.engine.sampling.gpm import GPM_COLUMNS, GPM_FLAKY_READS, GPM_PERIOD_S
from traceml_nb.engine.sampling.gpu import (
    COLUMNS,
    GPM_ON_MIG,
    PCIE_COUNTER_PERIOD_S,
    PCIE_COUNTER_WIDE_PERIOD_S,
    SLOW_FIELDS_PERIOD_S,
    GpuSource,
    describe_clock_events,
)
from traceml_nb.engine.sampling.gpu_devices import (
    CudaDeviceIds,
    NvmlDevice,
    match_cuda_device,
    normalise_uuid,
    parse_pci_bus_id,
    torch_allocator_reader,
)
from traceml_nb.engine.sampling.gpu_open import open_gpu_sources

NO_IDS = CudaDeviceIds()
NVML_COLUMNS = [c for c in COLUMNS if not c.startswith("torch_") and c not in GPM_COLUMNS]


def no_ids(index: int) -> CudaDeviceIds:
    return NO_IDS


def no_allocator(index: int) -> None:
    return None


def open_one(
    nvml: FakeNvml, caps: Capabilities | None = None, *, every_tick: bool = True, **kwargs
) -> GpuSource:
    """The source of cuda:0; ``every_tick``: power and temperature are read at every call (how
    often each field is read has tests of its own)."""
    caps = caps if caps is not None else Capabilities()
    kwargs.setdefault("device_ids", no_ids)
    kwargs.setdefault("environ", {})
    kwargs.setdefault("allocator", no_allocator)
    sources = open_gpu_sources([0], caps, nvml=nvml, **kwargs)
    assert list(sources) == [0], caps
    if every_tick:
        sources[0].slow_fields_period_s = 0.0
    return sources[0]


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# --- the real NVML on this machine ----------------------------------------------------------


def real_nvml_starts() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_real_nvml_init_failure_gives_a_clean_reason():
    if real_nvml_starts():
        pytest.skip("NVML works on this machine")
    caps = Capabilities()
    sources = open_gpu_sources([0], caps)
    assert sources == {}  # CPU torch: not even an allocator-only source
    for name in ("nvml", "gpu_utilisation"):
        assert caps.available[name] is False
        reason = caps.why(name)
        assert "\n" not in reason and "Traceback" not in reason and "NVMLError" not in reason
        assert "not found" in reason or "not loaded" in reason, reason
    assert caps.why("nvml") == (
        "the NVIDIA driver library, libnvidia-ml, was not found: no NVIDIA driver on this machine"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_is_matched_by_uuid_and_read():
    if not real_nvml_starts():
        pytest.skip("NVML does not start here")
    caps = Capabilities()
    index = torch.cuda.current_device()
    x = torch.ones(1024, 1024, device=f"cuda:{index}")  # something for the allocator to hold
    sources = open_gpu_sources([index], caps)
    src = sources[index]
    try:
        values = src.read()
        assert caps.ok("nvml") and caps.ok("gpu_memory"), caps
        assert src.device is not None and normalise_uuid(src.device.uuid) == normalise_uuid(
            str(torch.cuda.get_device_properties(index).uuid)
        )
        assert not any("by position" in n for n in caps.notes)
        assert values["mem_total_mb"] > 0 and 0 < values["mem_used_mb"] <= values["mem_total_mb"]
        assert (
            values["torch_alloc_mb"] >= 4.0 and values["torch_peak_mb"] >= values["torch_alloc_mb"]
        )
        if caps.ok("gpu_utilisation"):
            assert 0 <= values["util_gpu_pct"] <= 100
    finally:
        src.close()
        del x


def test_pynvml_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    caps = Capabilities()
    assert open_gpu_sources([0], caps, allocator=no_allocator) == {}
    assert (
        caps.why("nvml")
        == "nvidia-ml-py, the pynvml module, is not installed, so GPU counters cannot be read"
    )
    assert caps.why("gpu_utilisation") == caps.why("nvml")


@pytest.mark.parametrize(
    "code, words",
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml, was not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "different versions"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML failed to start, NVML: Unknown Error"),
    ],
)
def test_init_failure_of_each_class(code, words):
    nvml = FakeNvml(make_gpus(1), init_error=code)
    caps = Capabilities()
    assert (
        open_gpu_sources(
            [0], caps, nvml=nvml, device_ids=no_ids, environ={}, allocator=no_allocator
        )
        == {}
    )
    assert words in caps.why("nvml")
    assert caps.why("gpu_utilisation") == caps.why("nvml")
    assert nvml.shutdowns == 0 and nvml.calls["nvmlDeviceGetCount"] == 0


def test_init_failure_keeps_the_allocator_when_cuda_works():
    nvml = FakeNvml(make_gpus(1), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    caps = Capabilities()
    sources = open_gpu_sources(
        [0],
        caps,
        nvml=nvml,
        device_ids=no_ids,
        environ={},
        allocator=lambda i: lambda: (1.5, 2.0, 3.0),
    )
    values = sources[0].read()
    assert (values["torch_alloc_mb"], values["torch_reserved_mb"], values["torch_peak_mb"]) == (
        1.5,
        2.0,
        3.0,
    )
    assert all(values[c] is None for c in [*NVML_COLUMNS, *GPM_COLUMNS])
    assert not caps.ok("nvml") and caps.ok("gpu_memory")
    assert caps.why("gpm") == caps.why("gpm_sm_active") == caps.why("nvml")
    sources[0].close()


def test_error_classes_are_pynvmls_own():
    err = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(err) is pynvml.NVMLError_NotSupported
    assert nb.classify(err) == nb.UNSUPPORTED
    assert nb.classify(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)) == nb.TRANSIENT
    assert nb.classify(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == nb.LOST
    assert nb.classify(pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)) == nb.LOST
    assert nb.classify(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)) == nb.FLAKY
    assert nb.error_text(err) == "NVML: Not Supported"


# --- reading ---------------------------------------------------------------------------------


def test_every_field_is_read_in_its_unit():
    nvml = FakeNvml(make_gpus(1))
    caps = Capabilities()
    src = open_one(nvml, caps, allocator=lambda i: lambda: (100.0, 200.0, 150.0))
    src.pcie_counter_period_s = 0.0  # (read at most every 0.2 s: the probe at open just did)
    values = src.read()
    assert set(values) == set(COLUMNS)
    assert values == {
        "util_gpu_pct": 87.0,
        "util_mem_pct": 41.0,
        "mem_used_mb": 4096.0,
        "mem_total_mb": 16384.0,
        "power_w": 215.5,
        "power_limit_w": 300.0,
        "sm_clock_mhz": 1410.0,
        "sm_clock_max_mhz": 1980.0,
        "temp_c": 64.0,
        "pcie_rx_mbps": pytest.approx(1000.0, rel=1e-6),
        "pcie_tx_mbps": pytest.approx(250.0, rel=1e-6),
        "throttle_reasons": 4.0,
        "sm_active_pct": None,  # an A100: no GPM
        "sm_occupancy_pct": None,
        "tensor_active_pct": None,
        "dram_bw_pct": None,
        "torch_alloc_mb": 100.0,
        "torch_reserved_mb": 200.0,
        "torch_peak_mb": 150.0,
    }
    assert {k: v for k, v in caps.available.items() if not k.startswith("gpm")} == {
        "nvml": True,
        "gpu_utilisation": True,
        "gpu_memory": True,
    }
    assert caps.why("gpm") == "this GPU has no GPM metrics (Hopper and later GPUs have them)"
    assert caps.notes == []
    assert src.pcie_method == "byte counters"
    src.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU build of torch")
def test_cpu_torch_gives_no_allocator_values():
    src = open_one(FakeNvml(make_gpus(1)), allocator=torch_allocator_reader)  # CUDA unavailable
    values = src.read()
    assert values["torch_alloc_mb"] is None and values["torch_peak_mb"] is None
    src.close()


FIELD_COLUMNS = {
    "utilization": ["util_gpu_pct", "util_mem_pct"],
    "memory": ["mem_used_mb", "mem_total_mb"],
    "power": ["power_w"],
    "power_limit": ["power_limit_w"],
    "sm_clock": ["sm_clock_mhz"],
    "max_sm_clock": ["sm_clock_max_mhz"],
    "temperature": ["temp_c"],
    "clock_events": ["throttle_reasons"],
    "pcie_counters": [],  # falls back to nvmlDeviceGetPcieThroughput
}


@pytest.mark.parametrize("field", sorted(FIELD_COLUMNS))
def test_not_supported_field_is_none_and_not_asked_again(field):
    gpu = make_gpus(1)[0].set(field, error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    nvml = FakeNvml([gpu])
    caps = Capabilities()
    src = open_one(nvml, caps)
    first = src.read()
    calls = gpu.fields[field].calls
    for _ in range(5):
        values = src.read()
    for column in FIELD_COLUMNS[field]:
        assert first[column] is None and values[column] is None  # unavailable, never 0
    others = [c for c in NVML_COLUMNS if c not in FIELD_COLUMNS[field] and "pcie" not in c]
    assert all(values[c] is not None for c in others), values
    assert gpu.fields[field].calls == calls  # not asked again every tick
    if FIELD_COLUMNS[field]:
        assert any(FIELD_COLUMNS[field][0] in note for note in caps.notes), caps.notes
        assert any("Not Supported" in note or "not reported" in note for note in caps.notes)
    src.close()


def test_unsupported_found_mid_run_is_noted():
    gpu = make_gpus(1)[0].set(
        "temperature", 70, fail_after=3, fail_with=pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    caps = Capabilities()
    src = open_one(FakeNvml([gpu]), caps)
    rows = []
    for _ in range(5):
        values = src.read()
        src.table.append(0.0, values)
        rows.append(values["temp_c"])
    assert rows == [70.0, 70.0, None, None, None]  # the probe at open took the first good read
    assert any("temp_c unavailable" in n and "Not Supported" in n for n in caps.notes), caps.notes
    src.close()


def test_timeout_is_none_for_that_tick_only():
    gpu = make_gpus(1)[0].set(
        "power", 200_000, fail_after=3, fail_with=pynvml.NVML_ERROR_TIMEOUT, fail_for=1
    )
    src = open_one(FakeNvml([gpu]))
    readings = [src.read()["power_w"] for _ in range(4)]
    assert readings == [200.0, 200.0, None, 200.0]
    src.close()


def test_unknown_error_once_is_tolerated_repeated_is_lost():
    gpu = make_gpus(1)[0].set(
        "sm_clock", 1500, fail_after=2, fail_with=pynvml.NVML_ERROR_UNKNOWN, fail_for=2
    )
    src = open_one(FakeNvml([gpu]))
    assert [src.read()["sm_clock_mhz"] for _ in range(4)] == [1500.0, None, None, 1500.0]
    src.close()

    gpu = make_gpus(1)[0].set("sm_clock", 1500, fail_after=2, fail_with=pynvml.NVML_ERROR_UNKNOWN)
    src = open_one(FakeNvml([gpu]))
    src.read()
    src.read()
    src.read()
    with pytest.raises(SourceLost, match="Unknown Error"):
        src.read()
    src.close()


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    ],
)
def test_lost_gpu_raises_source_lost(code):
    gpu = make_gpus(1)[0].set("power", 200_000, fail_after=2, fail_with=code)
    src = open_one(FakeNvml([gpu]))
    src.read()
    with pytest.raises(SourceLost, match="reading power"):
        src.read()
    src.close()


def test_gpu_lost_at_open_leaves_no_source_and_shuts_nvml_down():
    gpu = make_gpus(1)[0].set("temperature", error=pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml = FakeNvml([gpu])
    caps = Capabilities()
    assert (
        open_gpu_sources(
            [0], caps, nvml=nvml, device_ids=no_ids, environ={}, allocator=no_allocator
        )
        == {}
    )
    assert "GPU is lost" in caps.why("nvml")
    assert nvml.inits == nvml.shutdowns == 1


def test_clock_event_reasons_fall_back_to_throttle_reasons():
    gpu = make_gpus(1)[0].set("throttle_reasons", 0x40)
    nvml = FakeNvml([gpu], missing={"nvmlDeviceGetCurrentClocksEventReasons"})  # old binding
    src = open_one(nvml)
    assert src.read()["throttle_reasons"] == 0x40
    src.close()

    gpu = make_gpus(1)[0].set("clock_events", error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    gpu.set("throttle_reasons", 0x24)
    src = open_one(FakeNvml([gpu]))  # new binding, old driver
    assert src.read()["throttle_reasons"] == 0x24
    assert describe_clock_events(0x24) == ["software power cap", "software thermal slowdown"]
    assert describe_clock_events(None) == [] and describe_clock_events(float("nan")) == []
    assert describe_clock_events(0x1001) == ["GPU idle", "other (0x1000)"]
    src.close()


def test_pcie_falls_back_to_throughput_read_at_most_once_a_period():
    gpu = make_gpus(1)[0].set("pcie_counters", error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    now = [100.0]
    caps = Capabilities()
    src = open_one(FakeNvml([gpu]), caps, pcie_throughput_period_s=1.0)
    src._clock = lambda: now[0]
    assert src.pcie_method == "throughput"
    readings = []
    for t in (100.0, 100.5, 101.0, 101.2, 102.1):
        now[0] = t
        values = src.read()
        readings.append((values["pcie_rx_mbps"], values["pcie_tx_mbps"]))
    assert readings == [(500.0, 125.0), (None, None), (500.0, 125.0), (None, None), (500.0, 125.0)]
    src.close()


def test_pcie_counters_give_the_rate_between_samples():
    counter = PcieCounter(rx_mib_s=3000.0, tx_mib_s=10.0, step_us=50_000)
    gpu = make_gpus(1)[0].set("pcie_counters", counter)
    src = open_one(FakeNvml([gpu]))
    src.pcie_counter_period_s = 0.0
    values = src.read()
    assert values["pcie_rx_mbps"] == pytest.approx(3000.0, rel=1e-6)
    assert values["pcie_tx_mbps"] == pytest.approx(10.0, rel=1e-5)
    counter.step_us = 0  # NVML has not refreshed the counters since the last sample
    assert src.read()["pcie_rx_mbps"] is None
    src.close()


def test_pcie_counters_are_read_at_most_every_period():
    counter = PcieCounter(rx_mib_s=800.0, step_us=100_000)
    gpu = make_gpus(1)[0].set("pcie_counters", counter)
    src = open_one(FakeNvml([gpu]))
    now = [time.monotonic()]  # the probe at open read them a moment ago
    src._clock = lambda: now[0]
    assert src.pcie_counter_period_s == PCIE_COUNTER_WIDE_PERIOD_S  # 64-bit: cannot wrap
    src.pcie_counter_period_s = 0.2
    readings = []
    for _ in range(6):  # 10 Hz
        now[0] += 0.1
        readings.append(src.read()["pcie_rx_mbps"])
    assert [r is not None for r in readings] == [False, True, False, True, False, True]
    assert readings[1] == pytest.approx(800.0, rel=1e-6)  # the average since the last read
    assert gpu.fields["pcie_counters"].calls == 1 + 1 + 3  # at open, the probe, then 3 of 6
    src.close()


def test_pcie_32_bit_counters_wrap_around():
    counter = PcieCounter(rx_mib_s=3000.0, tx_mib_s=1.0, step_us=1_000_000, bits=32)
    src = open_one(FakeNvml([make_gpus(1)[0].set("pcie_counters", counter)]))
    src.pcie_counter_period_s = 0.0
    rates = [src.read()["pcie_rx_mbps"] for _ in range(6)]  # 3000 MiB a read: wraps every ~1.4
    assert rates == pytest.approx([3000.0] * 6, rel=1e-6)
    src.close()


def test_nvml_shuts_down_once_when_the_last_source_closes():
    nvml = FakeNvml(make_gpus(2))
    caps = Capabilities()
    sources = open_gpu_sources(
        [0, 1], caps, nvml=nvml, device_ids=no_ids, environ={}, allocator=no_allocator
    )
    assert len(sources) == 2 and nvml.initialised
    sources[0].close()
    assert nvml.initialised
    sources[1].close()
    sources[1].close()
    assert nvml.shutdowns == 1 and not nvml.initialised
    assert any("by position" in n for n in caps.notes)  # no ids, no CUDA_VISIBLE_DEVICES, 2 GPUs


# --- MIG -------------------------------------------------------------------------------------


def mig_setup():
    gpus = make_gpus(2, mig_on=[1])
    inst0 = gpus[1].add_mig("MIG-0f0f0f0f-aaaa-bbbb-cccc-000000000000")
    inst1 = gpus[1].add_mig("MIG-1e1e1e1e-aaaa-bbbb-cccc-111111111111", memory_total_mib=9856.0)
    return gpus, inst0, inst1


def test_mig_instance_by_uuid_reports_no_utilisation_and_its_own_memory():
    gpus, _inst0, inst1 = mig_setup()
    gpus[1].set("temperature", 55)
    nvml = FakeNvml(gpus)
    caps = Capabilities()
    torch_uuid = "1e1e1e1e-aaaa-bbbb-cccc-111111111111"  # what torch says: no "MIG-" prefix
    src = open_one(nvml, caps, device_ids=lambda i: CudaDeviceIds(uuid=torch_uuid))
    assert src.device is not None and src.device.is_mig and src.device.mig_index == 1
    values = src.read()
    assert values["util_gpu_pct"] is None and values["util_mem_pct"] is None
    assert values["mem_total_mb"] == 9856.0  # the instance's memory, not the GPU's
    assert values["temp_c"] == 55.0 and values["power_w"] == 215.5  # from the parent GPU
    assert inst1.fields["utilization"].calls == 0  # never asked
    assert not caps.ok("gpu_utilisation")
    assert "MIG mode is enabled" in caps.why("gpu_utilisation")
    assert caps.ok("nvml") and caps.ok("gpu_memory")
    src.close()


def test_mig_enabled_gpu_matched_by_pci_says_memory_is_whole_gpu():
    gpus, _, _ = mig_setup()
    caps = Capabilities()
    src = open_one(
        FakeNvml(gpus), caps, device_ids=lambda i: CudaDeviceIds(pci_bus_id="0000:20:00.0")
    )
    assert src.device is not None and src.device.index == 1 and not src.device.is_mig
    assert src.read()["util_gpu_pct"] is None
    assert "MIG" in caps.why("gpu_utilisation")
    assert any("whole GPU" in n for n in caps.notes)
    src.close()


# --- mapping CUDA devices to NVML devices ------------------------------------------------------


def devices(n: int = 4) -> list[NvmlDevice]:
    return [
        NvmlDevice(
            i,
            f"GPU-{i}{i}{i}{i}0000-1111-2222-3333-44445555666{i}",
            f"00000000:{16 * (i + 1):02X}:00.0",
        )
        for i in range(n)
    ]


def test_uuid_normalisation_and_pci_parsing():
    assert (
        normalise_uuid("GPU-ABCD-12")
        == "abcd12"
        == normalise_uuid("abcd-12")
        == normalise_uuid("MIG-abcd12")
    )
    assert parse_pci_bus_id("00000000:41:00.0") == (0, 0x41, 0) == parse_pci_bus_id("0000:41:00.0")
    assert parse_pci_bus_id("41:00.0") == (0, 0x41, 0)
    assert parse_pci_bus_id("garbage") is None and parse_pci_bus_id(None) is None


def test_match_by_uuid_ignores_order_prefix_and_case():
    devs = devices()
    ids = CudaDeviceIds(uuid="22220000-1111-2222-3333-444455556662")  # torch's format
    match = match_cuda_device(0, ids, devs, visible_devices="3,1")  # the uuid wins over the env
    assert match is not None and (match.device.index, match.method, match.note) == (2, "uuid", "")
    upper = CudaDeviceIds(uuid="GPU-33330000-1111-2222-3333-444455556663".upper())
    assert match_cuda_device(0, upper, devs, None).device.index == 3


def test_match_by_pci_bus_id_when_uuid_unknown_to_nvml():
    devs = devices()
    ids = CudaDeviceIds(uuid="ffffffff-0000-0000-0000-000000000000", pci_bus_id="0000:30:00.0")
    match = match_cuda_device(0, ids, devs, None)
    assert match is not None and (match.device.index, match.method) == (2, "pci_bus_id")


def test_match_by_reordered_cuda_visible_devices():
    devs = devices()
    first = match_cuda_device(0, NO_IDS, devs, "2,0")
    second = match_cuda_device(1, NO_IDS, devs, "2,0")
    assert (first.device.index, first.method) == (2, "CUDA_VISIBLE_DEVICES")
    assert second.device.index == 0
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in first.note  # integers assume CUDA orders like NVML
    assert match_cuda_device(0, NO_IDS, devs, "2,0", device_order="PCI_BUS_ID").note == ""
    assert match_cuda_device(2, NO_IDS, devs, "2,0") is None  # CUDA sees two devices only


def test_match_by_uuid_prefixes_in_cuda_visible_devices():
    devs = devices()
    match = match_cuda_device(1, NO_IDS, devs, " GPU-1111 , GPU-3333")
    assert match is not None and match.device.index == 3 and match.note == ""
    ambiguous = [NvmlDevice(0, "GPU-abc1"), NvmlDevice(1, "GPU-abc2")]
    assert match_cuda_device(0, NO_IDS, ambiguous, "GPU-abc") is None


def test_cuda_visible_devices_stops_at_the_first_invalid_entry():
    devs = devices()
    assert match_cuda_device(0, NO_IDS, devs, "1,junk,2").device.index == 1
    assert match_cuda_device(2, NO_IDS, devs, "1,junk,2") is None
    assert match_cuda_device(0, NO_IDS, devs, "") is None
    assert match_cuda_device(0, NO_IDS, devs, "-1") is None
    assert match_cuda_device(0, NO_IDS, devs, "7") is None  # no such GPU


def test_match_mig_uuid_in_cuda_visible_devices():
    gpu = NvmlDevice(0, "GPU-aaaa0000", "00000000:10:00.0", mig_enabled=True)
    insts = [
        NvmlDevice(0, "MIG-bbbb0000-1111", "00000000:10:00.0", 0, True),
        NvmlDevice(0, "MIG-cccc0000-2222", "00000000:10:00.0", 1, True),
    ]
    match = match_cuda_device(0, NO_IDS, [gpu, *insts], "MIG-cccc")
    assert match is not None and match.device.mig_index == 1
    legacy = "MIG-GPU-aaaa0000/1/0"  # the pre-R470 form names no instance UUID
    assert match_cuda_device(0, NO_IDS, [gpu, *insts, NvmlDevice(1, "GPU-dddd")], legacy) is None
    by_uuid = match_cuda_device(0, CudaDeviceIds(uuid="bbbb0000-1111"), [gpu, *insts], None)
    assert by_uuid.device.mig_index == 0 and by_uuid.method == "uuid"


def test_position_fallback_is_noted_and_only_when_nothing_else_says():
    devs = devices(2)
    match = match_cuda_device(1, NO_IDS, devs, None)
    assert match.method == "position" and match.device.index == 1
    assert "by position" in match.note and "cuda:1" in match.note
    only = match_cuda_device(0, NO_IDS, devices(1), None)
    assert (only.method, only.note) == ("only GPU", "")
    assert match_cuda_device(5, NO_IDS, devs, None) is None


def test_open_maps_reordered_visible_devices_end_to_end():
    nvml = FakeNvml(make_gpus(3))
    caps = Capabilities()
    env = {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    sources = open_gpu_sources(
        [0, 1], caps, nvml=nvml, device_ids=no_ids, environ=env, allocator=no_allocator
    )
    assert sources[0].device.index == 2 and sources[1].device.index == 0
    assert "NVML GPU 2" in sources[0].name
    assert caps.notes == []
    for src in sources.values():
        src.close()


def test_unmatched_device_gives_a_reason():
    caps = Capabilities()
    nvml = FakeNvml(make_gpus(2))
    env = {"CUDA_VISIBLE_DEVICES": "GPU-ffff"}
    assert (
        open_gpu_sources(
            [0], caps, nvml=nvml, device_ids=no_ids, environ=env, allocator=no_allocator
        )
        == {}
    )
    assert "could not be matched" in caps.why("nvml")
    assert nvml.shutdowns == 1


# --- through the collector thread ------------------------------------------------------------


def train_steps(model, opt, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_gpu_lost_mid_run_at_50_hz_drops_the_source_and_training_goes_on():
    gpu = make_gpus(1)[0].set("power", 200_000, fail_after=10)  # lost after the 10th read
    nvml = FakeNvml([gpu])
    caps = Capabilities()
    src = open_one(nvml, caps)
    collector = Collector([src], 0.02, caps, t0=time.perf_counter())
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses: list[float] = []
    collector.start()
    try:
        deadline = time.monotonic() + 10
        while collector.running and time.monotonic() < deadline:
            losses += train_steps(model, opt, 5)
        losses += train_steps(model, opt, 20)  # after the loss too
        assert not collector.running  # the thread ended by itself: no source left
    finally:
        collector.stop()
    assert all(math.isfinite(v) for v in losses) and len(losses) >= 20
    assert collector.sources == []
    lost = [n for n in caps.notes if "lost" in n]
    assert len(lost) == 1 and "GPU is lost" in lost[0] and src.name in lost[0], caps.notes
    assert nvml.shutdowns == 1  # the dropped source closed NVML
    power = src.table.column("power_w")
    assert len(power) >= 8 and all(v == 200.0 for v in power)  # rows before the loss are kept


def test_gpu_lost_mid_run_keeps_the_host_source_sampling():
    from traceml_nb.engine.sampling.host import open_host_source

    gpu = make_gpus(1)[0].set("temperature", 60, fail_after=5)
    caps = Capabilities()
    src = open_one(FakeNvml([gpu]), caps)
    host = open_host_source(caps)
    collector = Collector([host, src], 0.02, caps, t0=time.perf_counter())
    collector.start()
    try:
        assert wait_until(lambda: src not in collector.sources)
        rows = len(host.table)
        assert wait_until(lambda: len(host.table) >= rows + 3)
        assert collector.running
    finally:
        collector.stop()
    assert not collector.running


@pytest.mark.parametrize("interval, duration", [(0.02, 0.6), (1.0, 2.3)])
def test_sampling_interval_from_50_to_1_hz(interval, duration):
    caps = Capabilities()
    src = open_one(FakeNvml(make_gpus(1)), caps)
    collector = Collector([src], interval, caps, t0=time.perf_counter())
    collector.start()
    time.sleep(duration)
    collector.stop()
    t = src.table.column("t")
    expected = duration / interval + 1
    assert 0.6 * expected <= len(t) <= expected + 1
    gaps = [b - a for a, b in zip(t, t[1:], strict=False)]
    assert statistics.median(gaps) == pytest.approx(interval, rel=0.2)
    assert all(v == 87.0 for v in src.table.column("util_gpu_pct"))


def test_run_with_a_fake_gpu_records_samples_and_survives_the_loss():
    import traceml_nb

    gpu = make_gpus(1)[0].set("memory", fail_after=8)
    nvml = FakeNvml([gpu])
    data = torch.utils.data.TensorDataset(torch.randn(64, 8))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run(
        "fake-gpu", device="cuda:0", backends=Backends(nvml=nvml), interval=0.02
    ) as run:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("lost" in n for n in run.capabilities.notes):
            for (x,) in loader:
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    assert run.status == "completed"
    assert 0 in run.record.gpus and len(run.record.gpus[0]) >= 5
    assert run.capabilities.ok("nvml") and run.capabilities.ok("gpu_utilisation")
    assert any("GPU cuda:0" in n and "GPU is lost" in n for n in run.capabilities.notes)
    assert nvml.shutdowns == 1


# --- how often each field is read -------------------------------------------------------------


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def open_with_clock(
    nvml: FakeNvml, caps: Capabilities | None = None
) -> tuple[GpuSource, FakeClock]:
    """A source on a fake clock from its opening on (``GpuSource`` reads it at open)."""
    clock = FakeClock()
    caps = caps if caps is not None else Capabilities()
    sources = open_gpu_sources(
        [0], caps, nvml=nvml, device_ids=no_ids, environ={}, allocator=no_allocator,
        clock=clock,
    )  # fmt: skip
    return sources[0], clock


def tick(src: GpuSource, clock: FakeClock, ticks: int, interval: float = 0.1) -> list[dict]:
    rows = []
    for _ in range(ticks):
        clock.now += interval
        rows.append(src.read())
    return rows


def per_second(rows: list[dict], column: str) -> list[float | None]:
    """The value of ``column`` read in each second of 10 Hz rows (None: none was read)."""
    out = []
    for k in range(len(rows) // 10):
        read = [r[column] for r in rows[10 * k : 10 * k + 10] if r[column] is not None]
        assert len(read) <= 1
        out.append(read[0] if read else None)
    return out


def test_slow_fields_are_read_less_often_than_the_tick():
    gpu = make_gpus(1)[0].enable_gpm()
    nvml = FakeNvml([gpu])
    src, clock = open_with_clock(nvml)
    opened = {name: f.calls for name, f in gpu.fields.items()}
    rows = tick(src, clock, 50)  # 5 s at 10 Hz
    read = {name: f.calls - opened[name] for name, f in gpu.fields.items()}
    assert read["utilization"] == read["memory"] == read["sm_clock"] == read["clock_events"] == 50
    seconds = 50 * 0.1
    assert (
        read["power"] == read["temperature"] == pytest.approx(seconds / SLOW_FIELDS_PERIOD_S, abs=1)
    )
    assert read["pcie_counters"] == pytest.approx(seconds / PCIE_COUNTER_WIDE_PERIOD_S, abs=1)
    assert read["gpm_sample"] == pytest.approx(seconds / GPM_PERIOD_S, abs=1)
    assert nvml.calls["nvmlGpmMetricsGet"] == read["gpm_sample"]
    assert read["power_limit"] == read["max_sm_clock"] == 0  # once, at open
    # every row has the static ones and the per-tick ones; the slow ones when read
    assert all(r["mem_total_mb"] == 16384.0 and r["util_gpu_pct"] == 87.0 for r in rows)
    powers = [r["power_w"] for r in rows]
    assert powers[0] == 215.5  # the first row has every field
    assert sum(p is not None for p in powers) == read["power"]
    assert all(p in (None, 215.5) for p in powers)  # never 0 in between
    src.close()


def test_32_bit_pcie_counters_are_read_every_fifth_of_a_second():
    gpu = make_gpus(1)[0].set("pcie_counters", PcieCounter(bits=32))
    src, clock = open_with_clock(FakeNvml([gpu]))
    assert src.pcie_counter_period_s == PCIE_COUNTER_PERIOD_S
    before = gpu.fields["pcie_counters"].calls
    tick(src, clock, 20)
    assert gpu.fields["pcie_counters"].calls - before == pytest.approx(2.0 / 0.2, abs=1)
    src.close()


# --- GPM ----------------------------------------------------------------------------------------


def test_gpm_metrics_on_a_hopper_gpu():
    gpu = make_gpus(1)[0].enable_gpm(sm_active=23.0, tensor_active=4.0)
    nvml = FakeNvml([gpu])
    caps = Capabilities()
    src, clock = open_with_clock(nvml, caps)
    assert src.has_gpm and caps.ok("gpm") and caps.ok("gpm_sm_active") and caps.ok("gpm_dram_bw")
    rows = tick(src, clock, 25)  # 2.5 s
    gpm = [r for r in rows if r["sm_active_pct"] is not None]
    assert len(gpm) == 2  # at 1 s and 2 s: none before a whole period
    assert gpm[0] == {**gpm[0], "sm_active_pct": 23.0, "sm_occupancy_pct": 11.5,
                      "tensor_active_pct": 4.0, "dram_bw_pct": 31.0}  # fmt: skip
    assert all(r[c] is None for r in rows if r not in gpm for c in GPM_COLUMNS)
    assert nvml.gpm_samples_live == 2
    src.close()
    assert nvml.gpm_samples_live == 0 and nvml.shutdowns == 1  # freed, then NVML shut down
    assert caps.notes == []


@pytest.mark.parametrize(
    "setup, words",
    [
        (lambda g: None, "this GPU has no GPM metrics (Hopper and later GPUs have them)"),
        (
            lambda g: g.enable_gpm().set("gpm_support", error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
            "the NVIDIA driver's NVML has no GPM (NVML: Function Not Found; it needs R525 or later)",
        ),
        (
            lambda g: g.enable_gpm().set("gpm_sample", error=pynvml.NVML_ERROR_NO_PERMISSION),
            "GPM could not be read (NVML: Insufficient Permissions)",
        ),
        (
            lambda g: g.enable_gpm().set("gpm_support", error=pynvml.NVML_ERROR_NOT_SUPPORTED),
            "GPM could not be read (NVML: Not Supported)",
        ),
    ],
    ids=["before Hopper", "driver without GPM", "no permission", "not supported"],
)
def test_gpm_unavailable_says_why_and_never_reads_zero(setup, words):
    gpu = make_gpus(1)[0]
    setup(gpu)
    nvml = FakeNvml([gpu])
    caps = Capabilities()
    src, clock = open_with_clock(nvml, caps)
    rows = tick(src, clock, 25)
    assert all(r[c] is None for r in rows for c in GPM_COLUMNS)
    assert rows[-1]["util_gpu_pct"] == 87.0  # the rest of the GPU is sampled
    assert not src.has_gpm
    for name in ("gpm", "gpm_sm_active", "gpm_sm_occupancy", "gpm_tensor_active", "gpm_dram_bw"):
        assert caps.why(name) == words
    src.close()
    assert nvml.gpm_samples_live == 0


def test_gpm_of_a_binding_too_old():
    gpu = make_gpus(1)[0].enable_gpm()
    nvml = FakeNvml([gpu], missing={"nvmlGpmQueryDeviceSupport"})
    caps = Capabilities()
    src, clock = open_with_clock(nvml, caps)
    assert all(r["sm_active_pct"] is None for r in tick(src, clock, 15))
    assert (
        caps.why("gpm")
        == "this nvidia-ml-py is too old for GPM (it has no nvmlGpmQueryDeviceSupport)"
    )
    src.close()


def test_gpm_metric_the_gpu_does_not_give_is_unavailable_alone():
    gpu = make_gpus(1)[0].enable_gpm(tensor_active=(None, pynvml.NVML_ERROR_NOT_SUPPORTED))
    caps = Capabilities()
    src, clock = open_with_clock(FakeNvml([gpu]), caps)
    rows = [r for r in tick(src, clock, 35) if r["sm_active_pct"] is not None]
    assert len(rows) == 3
    assert all(r["tensor_active_pct"] is None and r["dram_bw_pct"] == 31.0 for r in rows)
    assert caps.ok("gpm") and caps.ok("gpm_sm_active")
    assert caps.why("gpm_tensor_active") == (
        "GPU cuda:0 = NVML GPU 0 (Fake GPU 0): this GPU does not give the GPM metric "
        "tensor_active_pct "
        "(NVML: Not Supported)"
    )
    src.close()


def test_gpm_timeout_costs_one_period():
    gpu = make_gpus(1)[0].enable_gpm()
    gpu.set("gpm_sample", None, fail_after=2, fail_with=pynvml.NVML_ERROR_TIMEOUT, fail_for=1)
    caps = Capabilities()
    src, clock = open_with_clock(FakeNvml([gpu]), caps)
    active = per_second(tick(src, clock, 50), "sm_active_pct")
    assert active == [23.0, None, 23.0, 23.0, 23.0]  # then over the two periods around it
    assert caps.ok("gpm") and caps.notes == []
    src.close()


def test_gpm_failing_again_and_again_is_given_up_not_the_gpu():
    gpu = make_gpus(1)[0].enable_gpm()
    gpu.set("gpm_sample", None, fail_after=2, fail_with=pynvml.NVML_ERROR_UNKNOWN)
    caps = Capabilities()
    nvml = FakeNvml([gpu])
    src, clock = open_with_clock(nvml, caps)
    rows = tick(src, clock, 80)
    active = per_second(rows, "sm_active_pct")
    assert active[0] == 23.0 and active[1:] == [None] * 7
    assert gpu.fields["gpm_sample"].calls == 2 + GPM_FLAKY_READS  # not asked after giving up
    assert rows[-1]["util_gpu_pct"] == 87.0
    assert "Unknown Error" in caps.why("gpm") and "Unknown Error" in caps.why("gpm_sm_active")
    assert any("GPM metrics unavailable from now on" in n for n in caps.notes)
    assert nvml.gpm_samples_live == 0  # freed when given up
    src.close()


def test_gpu_lost_while_sampling_gpm_drops_the_source():
    gpu = make_gpus(1)[0].enable_gpm()
    gpu.set("gpm_sample", None, fail_after=2)  # GPU is lost
    nvml = FakeNvml([gpu])
    src, clock = open_with_clock(nvml)
    tick(src, clock, 10)
    with pytest.raises(SourceLost, match="GPU is lost.*GPM"):
        tick(src, clock, 10)
    src.close()
    assert nvml.gpm_samples_live == 0 and nvml.shutdowns == 1


def test_mig_device_has_no_gpm_with_the_reason():
    gpus, _inst0, _inst1 = mig_setup()
    gpus[1].enable_gpm()
    caps = Capabilities()
    torch_uuid = "1e1e1e1e-aaaa-bbbb-cccc-111111111111"
    src = open_one(FakeNvml(gpus), caps, device_ids=lambda i: CudaDeviceIds(uuid=torch_uuid))
    assert src.read()["sm_active_pct"] is None
    assert caps.why("gpm") == GPM_ON_MIG
    src.close()


def test_a_run_on_a_hopper_gpu_records_sm_activity_and_frees_gpm():
    import traceml_nb

    gpu = make_gpus(1)[0].enable_gpm(sm_active=31.0)
    nvml = FakeNvml([gpu])
    with traceml_nb.Run(
        "fake-hopper", device="cuda:0", backends=Backends(nvml=nvml), interval=0.05
    ) as run:
        time.sleep(2.1)
    active = [v for v in run.record.gpus[0].column("sm_active_pct") if v is not None]
    assert 1 <= len(active) <= 3 and set(active) == {31.0}  # about one a second
    rows = len(run.record.gpus[0])
    assert rows >= 4 * len(active)  # the 20 Hz rows between have none
    assert run.capabilities.ok("gpm") and run.capabilities.ok("gpm_sm_active")
    assert nvml.gpm_samples_live == 0 and nvml.shutdowns == 1
