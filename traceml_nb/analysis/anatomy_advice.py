"""Advice from where a step goes (:mod:`.step_anatomy`) and the precision its FLOPs ran in
(:mod:`.peak_flops`), for a run whose verdict is not about its input: each rule a named
constant of :mod:`.thresholds`, each finding with the figures it rests on.

* an input copy of at least ``COPY_SHARE_ADVICE`` of the step on a GPU: pinned memory
  (``pin_memory=True``) where the training loader does not pin, then ``non_blocking=True``
  copies, so that the copy overlaps the compute, each where what copies the batch takes it
  (``LoaderInfo.driver``: the Trainer's ``accelerator_config``, accelerate's
  ``DataLoaderConfiguration``; none where it cannot be set, :data:`COPIES_AS_THEY_ARE`);
* at least ``FP32_SHARE_ADVICE`` of the FLOPs in float32 (or tf32) on a GPU whose
  half-precision peak is at least ``HALF_PRECISION_GAIN`` times the peak they ran at: autocast,
  in bf16 where the GPU has it, else fp16 with a GradScaler (or the trainer's own setting for
  it, by driver);
* at least ``CONV_SHARE_ADVICE`` of the FLOPs in convolutions on NCHW inputs, on a GPU, in a
  tensor-core precision: ``channels_last`` for the model and its batches;
* an optimizer step of at least ``OPTIMIZER_SHARE_ADVICE`` of the step, of an optimizer that
  has a fused update and does not use it: ``fused=True`` (one operation for all parameters,
  on a CPU as on a GPU); of fastai's own optimizer (one tensor at a time, in Python): the
  torch optimizer that makes its update, fused, through fastai's ``OptimWrapper``; neither
  where the backward was not timed apart from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engine.optimizer_info import OptimizerInfo
from ..engine.record import LoaderInfo
from .advice import KERAS_DRIVERS, SKORCH_DRIVERS, role_of, setting_name
from .findings import Finding, Summary
from .peak_flops import peak_for
from .thresholds import (
    CONV_SHARE_ADVICE,
    COPY_SHARE_ADVICE,
    FP32_SHARE_ADVICE,
    HALF_PRECISION_GAIN,
    MOSTLY,
    OPTIMIZER_SHARE_ADVICE,
)

#: What copies the batch to the GPU in a way the user does not set: Lightning copies with
#: ``non_blocking=True`` already; fastai's DataLoader, Keras' trainer and skorch's
#: ``to_device`` copy without it, and nothing the user passes them changes that. A long copy
#: from pinned memory there has no ``non_blocking`` to advise.
COPIES_AS_THEY_ARE = frozenset({"lightning", "fastai", *KERAS_DRIVERS, *SKORCH_DRIVERS})


def anatomy_advice(
    summary: Summary,
    loader: LoaderInfo | None,
    gpu: bool,
    optimizers: Sequence[OptimizerInfo] = (),
) -> list[Finding]:
    """The findings of the rules above that hold for a run (``gpu``: it ran on a GPU;
    ``loader``: its training DataLoader, None where there is none; ``optimizers``: those that
    stepped)."""
    shares = summary.phase_shares
    found = []
    copy = shares.get("copy")
    if gpu and copy is not None and copy >= COPY_SHARE_ADVICE:
        role = role_of(loader)
        facts: dict[str, Any] = {"copy_share": copy, "copy_ms": summary.copy_ms_median, **role}
        if loader is not None and not loader.pin_memory:
            setting = setting_name("pin_memory", role["driver"], role["trains"])
            found.append(Finding("pin-memory-for-copies", {**facts, "setting": setting}))
        elif role["driver"] not in COPIES_AS_THEY_ARE:
            found.append(Finding("non-blocking-copies", facts))
    mixed = (
        _mixed_precision(summary, loader.driver if loader is not None else None) if gpu else None
    )
    if mixed is not None:
        found.append(mixed)
    if gpu and _nchw_convolutions(summary):
        found.append(Finding("channels-last", {"conv_share": summary.conv_share}))
    optimizer = shares.get("optimizer")
    unfused = [o.kind for o in optimizers if o.can_fuse]
    # the update's own share only where the backward was timed apart from it (a backward
    # counted in another phase may be in the optimizer's)
    alone = "backward" in shares
    if optimizer is None or optimizer < OPTIMIZER_SHARE_ADVICE or not alone:
        return found
    if unfused:
        driver = loader.driver if loader is not None else None
        facts = {"optimizer_share": optimizer, "optimizers": unfused, "driver": driver}
        found.append(Finding("fused-optimizer", facts))
    fastai = next((o for o in optimizers if o.fastai_twin is not None), None)
    if fastai is not None:
        facts = {
            "optimizer_share": optimizer,
            "kind": fastai.kind,
            "twin": fastai.fastai_twin,
            "twin_arguments": [[k, v] for k, v in fastai.twin_arguments],
            "tensors": fastai.tensors,
        }
        found.append(Finding("fastai-optimizer", facts))
    return found


def _mixed_precision(summary: Summary, driver: str | None) -> Finding | None:
    precisions = summary.flop_precisions
    single = precisions.get("fp32", 0.0) + precisions.get("tf32", 0.0)
    device = summary.flop_device
    if single < FP32_SHARE_ADVICE or not device:
        return None
    ran_in = "tf32" if precisions.get("tf32", 0.0) > precisions.get("fp32", 0.0) else "fp32"
    now = peak_for(device, ran_in).tflops
    half = next((d for d in ("bf16", "fp16") if peak_for(device, d).tflops is not None), None)
    if now is None or half is None:
        return None
    gain = (peak_for(device, half).tflops or 0.0) / now
    if gain < HALF_PRECISION_GAIN:
        return None
    return Finding(
        "mixed-precision",
        {
            "single_share": single,
            "ran_in": ran_in,
            "device": device,
            "dtype": half,
            "gain": gain,
            "driver": driver,
        },
    )


def _nchw_convolutions(summary: Summary) -> bool:
    """Most FLOPs are convolutions on NCHW inputs, run where cuDNN's tensor-core kernels (NHWC)
    would take them: fp16, bf16 or tf32."""
    tensor_cores = sum(summary.flop_precisions.get(d, 0.0) for d in ("fp16", "bf16", "tf32"))
    conv, nhwc = summary.conv_share, summary.channels_last_share
    return (
        conv is not None
        and conv >= CONV_SHARE_ADVICE
        and (nhwc is None or nhwc < MOSTLY)
        and tensor_cores >= MOSTLY
    )
