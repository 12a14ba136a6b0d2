"""What a GPU could do: the peak dense FLOP/s of the GPUs our users meet, by the dtype the
model's matrix work runs in, and the model FLOPs utilisation (MFU) against it.

Peaks are the vendor's data-sheet figures for **dense** work (the "with sparsity" figures
halved), in TFLOP/s (10¹² floating-point operations a second), at the boost clock. The dtype
keys: ``"fp32"`` (CUDA cores, no tensor cores), ``"tf32"`` (float32 tensors on tensor cores,
where torch's TF32 settings allow it: ``engine/instrument/tf32.py``),
``"fp16"`` and ``"bf16"`` (tensor cores, float32 accumulate; autocast or half parameters).
A GPU is told by the name NVML reports (``"Tesla T4"``, ``"NVIDIA A100-SXM4-80GB"``); a GPU or a
dtype not in the table has no peak, and MFU is then unavailable with why, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The dtypes a peak is given for.
DTYPES = ("fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True)
class PeakFlops:
    """One GPU model's dense peaks: ``tflops`` by dtype (a dtype absent: the GPU has no fast
    path for it, e.g. bfloat16 on a T4), ``pattern`` the regular expression its NVML name
    matches, ``source`` where the figures come from."""

    model: str
    pattern: str
    tflops: dict[str, float]
    source: str


_NVIDIA = "NVIDIA data sheet"
#: Most specific first: "A10G" before "A10", "H100 PCIe" before "H100".
PEAKS: tuple[PeakFlops, ...] = (
    PeakFlops("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0}, f"{_NVIDIA} (Tesla T4)"),
    PeakFlops(
        "P100 PCIe", r"P100-PCIE", {"fp32": 9.3, "fp16": 18.7}, f"{_NVIDIA} (Tesla P100 PCIe)"
    ),
    PeakFlops("P100", r"P100", {"fp32": 10.6, "fp16": 21.2}, f"{_NVIDIA} (Tesla P100 SXM2)"),
    PeakFlops("V100S", r"V100S", {"fp32": 16.4, "fp16": 130.0}, f"{_NVIDIA} (V100S PCIe)"),
    PeakFlops("V100 PCIe", r"V100-PCIE", {"fp32": 14.0, "fp16": 112.0}, f"{_NVIDIA} (V100 PCIe)"),
    PeakFlops("V100", r"V100", {"fp32": 15.7, "fp16": 125.0}, f"{_NVIDIA} (V100 SXM2)"),
    PeakFlops(
        "A10G",
        r"A10G",
        {"fp32": 31.5, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0},
        "AWS G5 / published A10G comparisons (NVIDIA publishes no A10G data sheet)",
    ),
    PeakFlops(
        "A10",
        r"\bA10\b",
        {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
        f"{_NVIDIA} (A10)",
    ),
    PeakFlops(
        "A100",
        r"A100",
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
        f"{_NVIDIA} (A100 40GB/80GB, PCIe and SXM)",
    ),
    PeakFlops(
        "L40S",
        r"L40S",
        {"fp32": 91.6, "tf32": 183.0, "fp16": 366.0, "bf16": 366.0},
        f"{_NVIDIA} (L40S)",
    ),
    PeakFlops(
        "L4",
        r"\bL4\b",
        {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
        f"{_NVIDIA} (L4)",
    ),
    PeakFlops(
        "H100 PCIe",
        r"H100 PCIe",
        {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
        f"{_NVIDIA} (H100 PCIe)",
    ),
    PeakFlops(
        "H100 NVL",
        r"H100 NVL",
        {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
        f"{_NVIDIA} (H100 NVL)",
    ),
    PeakFlops(
        "H100",
        r"H100",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
        f"{_NVIDIA} (H100 SXM)",
    ),
    PeakFlops(
        "H200 NVL",
        r"H200 NVL",
        {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
        f"{_NVIDIA} (H200 NVL)",
    ),
    PeakFlops(
        "H200",
        r"H200",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5},
        f"{_NVIDIA} (H200 SXM)",
    ),
)


def find_peak(gpu_name: str | None) -> PeakFlops | None:
    """The table's entry for the GPU NVML calls ``gpu_name`` (None: not in the table)."""
    if not gpu_name:
        return None
    for peak in PEAKS:
        if re.search(peak.pattern, gpu_name):
            return peak
    return None


@dataclass(frozen=True)
class PeakLookup:
    """A peak for a GPU and dtype: ``tflops`` (None: unknown, ``why`` says why) and its
    ``source``."""

    tflops: float | None
    source: str = ""
    why: str = ""


def peak_for(gpu_name: str | None, dtype: str) -> PeakLookup:
    """The dense peak TFLOP/s of ``gpu_name`` for ``dtype`` (one of :data:`DTYPES`)."""
    if dtype not in DTYPES:
        return PeakLookup(None, why=f"no peak is tabled for {dtype}")
    if not gpu_name:
        return PeakLookup(None, why="no GPU in this run (no peak FLOP/s is known for a CPU)")
    peak = find_peak(gpu_name)
    if peak is None:
        return PeakLookup(None, why=f"{gpu_name} is not in the table of peak FLOP/s")
    value = peak.tflops.get(dtype)
    if value is None:
        return PeakLookup(None, why=f"the {peak.model} has no {dtype} tensor cores")
    return PeakLookup(value, source=peak.source)


def mfu(flops_per_step: float, step_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation, 0..1: the FLOP/s the model's own FLOPs were done at
    (``flops_per_step`` over ``step_s`` seconds a step) as a share of ``peak_tflops``."""
    if flops_per_step < 0 or step_s <= 0 or peak_tflops <= 0:
        raise ValueError("mfu needs flops >= 0, step_s > 0 and a peak > 0")
    return flops_per_step / step_s / (peak_tflops * 1e12)


#: Precisions that did less than this share of a step's FLOPs do not need a peak of their own
#: (a loss computed in float32 beside fp16 matrix work): their FLOPs count at the peak of the
#: precision that did the most.
MINOR_PRECISION_SHARE = 0.01


@dataclass(frozen=True)
class Utilisation:
    """The MFU of a run: ``mfu`` (0..1) against ``peak_tflops``, the peak the step's FLOPs
    could at best have run at (each precision's FLOPs at that precision's peak: the total over
    the time they would take), or ``why`` it is unavailable."""

    mfu: float | None
    peak_tflops: float | None = None
    why: str = ""


def utilisation(by_dtype: dict[str, int], device: str, achieved_tflops: float) -> Utilisation:
    """The MFU of FLOPs that ran ``by_dtype`` (FLOPs by precision, as the FLOP count sums
    them) on ``device`` (``"cpu"`` or a CUDA device's name) at ``achieved_tflops``."""
    if not device or device == "cpu":
        return Utilisation(None, why="no peak FLOP/s is known for a CPU")
    total = sum(by_dtype.values())
    if total <= 0:
        return Utilisation(None, why="the FLOP count could not tell the precision they ran in")
    main = max(by_dtype, key=lambda k: by_dtype[k])
    seconds = 0.0
    for dtype, flops in by_dtype.items():
        if flops < MINOR_PRECISION_SHARE * total:
            dtype = main
        peak = peak_for(device, dtype)
        if peak.tflops is None:
            return Utilisation(None, why=peak.why)
        seconds += flops / (peak.tflops * 1e12)
    peak_tflops = total / seconds / 1e12
    return Utilisation(achieved_tflops / peak_tflops, peak_tflops)
