"""The peak FLOP/s table: NVML's names find their GPU (the most specific entry first), a dtype
a GPU has no fast path for and a GPU not in the table are unavailable with why, and MFU is the
model's FLOP/s over the peak."""

from __future__ import annotations

import pytest

from traceml_nb.analysis.peak_flops import (
    DTYPES,
    MINOR_PRECISION_SHARE,
    PEAKS,
    find_peak,
    mfu,
    peak_for,
    utilisation,
)

#: Names as NVML reports them (nvidia-smi's "Name") on the machines our users meet.
NVML_NAMES = {
    "Tesla T4": "T4",
    "Tesla P100-PCIE-16GB": "P100 PCIe",
    "Tesla P100-SXM2-16GB": "P100",
    "Tesla V100-SXM2-16GB": "V100",
    "Tesla V100-PCIE-32GB": "V100 PCIe",
    "Tesla V100S-PCIE-32GB": "V100S",
    "NVIDIA A10G": "A10G",
    "NVIDIA A10": "A10",
    "NVIDIA A100-SXM4-40GB": "A100",
    "NVIDIA A100 80GB PCIe": "A100",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA H100 80GB HBM3": "H100",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200",
    "NVIDIA H200 NVL": "H200 NVL",
}


@pytest.mark.parametrize(("name", "model"), sorted(NVML_NAMES.items()))
def test_nvml_names_find_their_gpu(name, model):
    peak = find_peak(name)
    assert peak is not None and peak.model == model


def test_names_not_in_the_table_find_nothing():
    for name in ("NVIDIA GeForce RTX 3060", "NVIDIA A40", "NVIDIA L40", "", None):
        assert find_peak(name) is None


def test_every_entry_is_tabled_sanely():
    for peak in PEAKS:
        assert set(peak.tflops) <= set(DTYPES) and "fp32" in peak.tflops, peak.model
        assert peak.source, peak.model
        fp32, tf32 = peak.tflops["fp32"], peak.tflops.get("tf32")
        half = peak.tflops["fp16"]
        assert fp32 <= (tf32 or fp32) <= half, peak.model  # tensor cores are the fast path


def test_the_dtype_picks_the_peak_and_a_missing_fast_path_says_so():
    assert peak_for("Tesla T4", "fp16").tflops == 65.0
    assert peak_for("Tesla T4", "fp32").tflops == 8.1
    t4_bf16 = peak_for("Tesla T4", "bf16")
    assert t4_bf16.tflops is None and t4_bf16.why == "the T4 has no bf16 tensor cores"
    h100 = peak_for("NVIDIA H100 80GB HBM3", "bf16")
    assert h100.tflops == 989.5 and "H100 SXM" in h100.source
    assert peak_for("NVIDIA A100-SXM4-80GB", "tf32").tflops == 156.0


def test_a_cpu_and_an_unknown_gpu_have_no_peak_and_say_why():
    cpu = peak_for(None, "fp32")
    assert cpu.tflops is None and "CPU" in cpu.why
    other = peak_for("NVIDIA GeForce RTX 3060", "fp32")
    assert other.tflops is None and other.why == (
        "NVIDIA GeForce RTX 3060 is not in the table of peak FLOP/s"
    )
    assert peak_for("Tesla T4", "fp8").tflops is None


def test_mfu_is_the_models_flops_per_second_over_the_peak():
    # 13 TFLOP a step in 0.2 s on a 65 TFLOP/s T4: 65 TFLOP/s done, all of it
    assert mfu(13e12, 0.2, 65.0) == pytest.approx(1.0)
    assert mfu(1.3e12, 0.2, 65.0) == pytest.approx(0.1)
    assert mfu(0.0, 0.2, 65.0) == 0.0
    for bad in ((-1.0, 0.2, 65.0), (1e12, 0.0, 65.0), (1e12, 0.2, 0.0)):
        with pytest.raises(ValueError):
            mfu(*bad)


def test_utilisation_is_the_achieved_flops_over_the_peak_of_their_precisions():
    fp16 = utilisation({"fp16": 10**12}, "Tesla T4", 13.0)
    assert fp16.mfu == pytest.approx(0.2) and fp16.peak_tflops == 65.0
    # half the FLOPs at each peak: the time they would take at best is what the peak means
    mixed = utilisation({"fp16": 10**12, "fp32": 10**12}, "Tesla T4", 1.0)
    assert mixed.peak_tflops == pytest.approx(2 / (1 / 65.0 + 1 / 8.1))
    assert mixed.mfu == pytest.approx(1.0 / mixed.peak_tflops)


def test_a_minor_precision_counts_at_the_main_ones_peak():
    below = int(MINOR_PRECISION_SHARE * 1000) - 1
    minor = utilisation({"fp16": 1000 - below, "float64": below}, "Tesla T4", 6.5)
    assert minor.peak_tflops == pytest.approx(65.0) and minor.mfu == pytest.approx(0.1)
    above = utilisation({"fp16": 1000 - below - 2, "float64": below + 2}, "Tesla T4", 6.5)
    assert above.mfu is None and above.why == "no peak is tabled for float64"


def test_utilisation_unavailable_says_why():
    assert utilisation({"fp32": 10}, "cpu", 1.0).why == "no peak FLOP/s is known for a CPU"
    assert utilisation({"bf16": 10}, "Tesla T4", 1.0).why == "the T4 has no bf16 tensor cores"
    assert "not in the table" in utilisation({"fp16": 10}, "NVIDIA A40", 1.0).why
    assert "precision" in utilisation({}, "Tesla T4", 1.0).why
