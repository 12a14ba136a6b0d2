"""Advice from where a step goes and the precision its FLOPs ran in: each rule on both sides of
its threshold, in the words the report gives, and never where the input is the limit."""

from __future__ import annotations

import pytest
import torch
from support.builders import make_summary
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.analysis.anatomy_advice import anatomy_advice
from traceml_nb.analysis.thresholds import (
    CONV_SHARE_ADVICE,
    COPY_SHARE_ADVICE,
    FP32_SHARE_ADVICE,
    HALF_PRECISION_GAIN,
    MOSTLY,
    OPTIMIZER_SHARE_ADVICE,
)
from traceml_nb.engine.optimizer_info import OptimizerInfo, optimizer_info
from traceml_nb.engine.record import LoaderInfo
from traceml_nb.views.diagnosis_words import sentence

SHARES = {"data_wait": 0.02, "copy": 0.01, "forward": 0.3, "backward": 0.5, "optimizer": 0.05}


def _loader(pin_memory: bool, driver: str | None = None, trains: bool = True) -> LoaderInfo:
    return LoaderInfo(
        slot=0,
        num_workers=2,
        pin_memory=pin_memory,
        prefetch_factor=2,
        persistent_workers=False,
        batch_size=32,
        dataset_type="D",
        dataset_len=1000,
        iterable=False,
        driver=driver,
        optimizer_steps=10 if trains else 0,
    )


def _codes(summary, loader=None, gpu=True) -> list[str]:
    return [f.code for f in anatomy_advice(summary, loader, gpu)]


def _summary(**shares):
    return make_summary(phase_shares={**SHARES, **shares}, flop_precisions={}, flop_device=None)


def test_a_long_copy_on_a_gpu_from_pageable_memory_asks_for_pinned_memory():
    below = _summary(copy=COPY_SHARE_ADVICE - 0.001)
    assert _codes(below, _loader(False)) == []
    long = _summary(copy=COPY_SHARE_ADVICE)
    (finding,) = anatomy_advice(long, _loader(False, driver="transformers"), True)
    assert finding.code == "pin-memory-for-copies"
    assert sentence(finding).startswith("The input copy takes 10% of each step (3.2 ms)")
    assert "dataloader_pin_memory=True" in sentence(finding)  # the Trainer's argument
    assert _codes(long, _loader(True)) == ["non-blocking-copies"]  # pinned already
    assert _codes(long, _loader(False), gpu=False) == []  # a CPU run copies nothing


@pytest.mark.parametrize(
    ("driver", "pageable", "pinned"),
    [
        (None, "pin_memory=True and copies with .to(device, non_blocking=True) let it", "copy "
         "the batch with .to(device, non_blocking=True) from pinned memory"),
        ("transformers", "dataloader_pin_memory=True and accelerator_config={'non_blocking': "
         "True} in the TrainingArguments let it", "accelerator_config={'non_blocking': True} in "
         "the TrainingArguments from pinned memory"),
        ("accelerate", "pin_memory=True and Accelerator(dataloader_config=DataLoaderConfiguration"
         "(non_blocking=True)) let it", "Accelerator(dataloader_config=DataLoaderConfiguration("
         "non_blocking=True)) from pinned memory"),
        ("lightning", "pin_memory=True lets it overlap the compute (Lightning copies with "
         "non_blocking=True)", None),
        ("fastai", "pin_memory=True makes it faster (fastai copies without non_blocking; the "
         "phase also holds its batch transforms, after_batch, which pinning does not speed up)",
         None),
        ("keras-fit", "pin_memory=True in a torch DataLoader given to model.fit makes it faster "
         "(Keras copies without non_blocking)", None),
        ("skorch", "iterator_train__pin_memory=True makes it faster (skorch copies without "
         "non_blocking)", None),
        ("skorch-arrays", "iterator_train__pin_memory=True makes it faster (skorch copies "
         "without non_blocking)", None),
    ],
)  # fmt: skip
def test_a_long_copy_is_advised_where_the_batch_is_copied(driver, pageable, pinned):
    """Where a framework copies the batch, the advice names its setting for a non-blocking
    copy (the Trainer's, accelerate's); where none can be set (Lightning copies non-blocking
    already; fastai, Keras and skorch copy without it), pinned memory alone, and nothing once
    pinned."""
    long = _summary(copy=COPY_SHARE_ADVICE)
    (finding,) = anatomy_advice(long, _loader(False, driver=driver), True)
    assert pageable in sentence(finding)
    advised = anatomy_advice(long, _loader(True, driver=driver), True)
    if pinned is None:
        assert advised == []
    else:
        assert [f.code for f in advised] == ["non-blocking-copies"]
        assert pinned in sentence(advised[0])
    # a prediction's loader: skorch names its settings apart (iterator_valid__)
    (predicting,) = anatomy_advice(long, _loader(False, driver=driver, trains=False), True)
    valid = pageable.replace("iterator_train__", "iterator_valid__")
    assert valid in sentence(predicting)


@pytest.mark.parametrize(
    ("device", "precisions", "advised"),
    [
        ("Tesla T4", {"fp32": FP32_SHARE_ADVICE}, "float16"),  # a T4: fp16 8x fp32, no bf16
        ("Tesla T4", {"fp32": FP32_SHARE_ADVICE - 0.01, "fp16": 0.51}, None),
        ("NVIDIA A100-SXM4-40GB", {"fp32": 1.0}, "bfloat16"),
        ("NVIDIA A100-SXM4-40GB", {"tf32": 1.0}, "bfloat16"),  # tf32 156 -> bf16 312: 2x
        ("NVIDIA A10G", {"tf32": 1.0}, "bfloat16"),  # 35 -> 70: 2x, the threshold itself
        ("NVIDIA A40", {"fp32": 1.0}, None),  # not in the table: nothing claimed
        (None, {"fp32": 1.0}, None),
    ],
)
def test_float32_flops_on_a_gpu_with_a_faster_half_precision_ask_for_autocast(
    device, precisions, advised
):
    summary = _summary()
    summary.flop_precisions, summary.flop_device = precisions, device
    found = [f for f in anatomy_advice(summary, _loader(True), True) if f.code == "mixed-precision"]
    assert bool(found) == (advised is not None)
    if advised:
        words = sentence(found[0])
        assert f'torch.autocast("cuda", dtype=torch.{advised})' in words
        assert ("GradScaler" in words) == (advised == "float16")


@pytest.mark.parametrize(
    ("driver", "t4", "a100"),
    [
        (None, 'run the forward under torch.autocast("cuda", dtype=torch.float16) with a '
         "torch.amp.GradScaler for the loss", 'run the forward under torch.autocast("cuda", '
         "dtype=torch.bfloat16)"),
        ("transformers", "set fp16=True in the TrainingArguments (the Trainer scales the loss)",
         "set bf16=True in the TrainingArguments"),
        ("lightning", 'set Trainer(precision="16-mixed") (Lightning scales the loss)',
         'set Trainer(precision="bf16-mixed")'),
        ("accelerate", 'set Accelerator(mixed_precision="fp16") (accelerator.backward scales '
         "the loss)", 'set Accelerator(mixed_precision="bf16")'),
        ("fastai", "set learn.to_fp16() (it scales the loss)", "set learn.to_bf16()"),
        ("keras-fit", 'set keras.mixed_precision.set_global_policy("mixed_float16") before the '
         "model is made", 'set keras.mixed_precision.set_global_policy("mixed_bfloat16") before '
         "the model is made"),
        ("skorch-arrays", 'set accelerator=Accelerator(mixed_precision="fp16") on a net class '
         "made with skorch.hf.AccelerateMixin (accelerate scales the loss)", "set accelerator="
         'Accelerator(mixed_precision="bf16") on a net class made with skorch.hf.AccelerateMixin '
         "(accelerate scales the loss)"),
    ],
)  # fmt: skip
def test_mixed_precision_is_asked_for_where_the_trainer_runs_the_forward(driver, t4, a100):
    """A trainer runs the forward and scales the loss itself: its own setting, in the half
    precision the GPU has (a T4 fp16, an A100 bf16); the user's own loop: autocast."""
    for device, how in (("Tesla T4", t4), ("NVIDIA A100-SXM4-40GB", a100)):
        summary = _summary()
        summary.flop_precisions, summary.flop_device = {"fp32": 1.0}, device
        found = anatomy_advice(summary, _loader(True, driver=driver), True)
        (mixed,) = [f for f in found if f.code == "mixed-precision"]
        assert sentence(mixed).endswith(f" that: {how}."), sentence(mixed)


def test_a_large_optimizer_share_asks_an_unfused_optimizer_for_fused_on_a_cpu_too():
    adam = [OptimizerInfo("Adam", fused=None, tensors=300, fusable=True)]
    below = _summary(optimizer=OPTIMIZER_SHARE_ADVICE - 0.001)
    assert anatomy_advice(below, None, False, adam) == []
    at = _summary(optimizer=OPTIMIZER_SHARE_ADVICE)
    (finding,) = anatomy_advice(at, None, False, adam)
    assert finding.code == "fused-optimizer"
    assert sentence(finding) == (
        "The optimizer step takes 15% of each step: create the Adam optimizer with fused=True, "
        "which updates all parameters in one operation instead of one per tensor."
    )
    gan = [*adam, *adam, OptimizerInfo("AdamW", fused=None, tensors=300, fusable=True)]
    (finding,) = anatomy_advice(at, None, False, gan)  # each kind named once ("Adam and Adam")
    assert "create the Adam and AdamW optimizers with fused=True" in sentence(finding)
    fused = [OptimizerInfo("Adam", fused=True, tensors=300, fusable=True)]
    assert anatomy_advice(at, None, False, fused) == []  # never what is set already
    lbfgs = [OptimizerInfo("LBFGS", tensors=300)]
    assert anatomy_advice(at, None, False, lbfgs) == []  # no fused update to ask for
    untimed = _summary(optimizer=0.9)  # a backward not timed apart: it may be in there
    del untimed.phase_shares["forward"], untimed.phase_shares["backward"]
    assert anatomy_advice(untimed, None, False, adam) == []


@pytest.mark.parametrize(
    ("driver", "kind", "how"),
    [
        ("transformers", "AdamW", 'optim="adamw_torch_fused" in the TrainingArguments (the '
         "Trainer makes the AdamW)"),
        ("transformers", "SGD", "create the SGD optimizer with fused=True"),  # one of the user's
        ("skorch", "Adam", "pass optimizer__fused=True to your skorch NeuralNet"),
        ("skorch-arrays", "SGD", "pass optimizer__fused=True to your skorch NeuralNet"),
        ("lightning", "Adam", "create the Adam optimizer with fused=True"),
    ],
)  # fmt: skip
def test_a_fused_update_is_asked_for_where_the_optimizer_is_made(driver, kind, how):
    """The Trainer makes its AdamW from ``optim``, skorch its optimizer from ``optimizer__``
    arguments; any other is the user's to create."""
    unfused = [OptimizerInfo(kind, fused=None, tensors=300, fusable=True)]
    at = _summary(optimizer=OPTIMIZER_SHARE_ADVICE)
    (finding,) = anatomy_advice(at, _loader(True, driver=driver), False, unfused)
    assert sentence(finding) == (
        f"The optimizer step takes 15% of each step: {how}, which updates all parameters in one "
        "operation instead of one per tensor."
    )


def test_a_large_share_of_fastais_own_optimizer_asks_for_its_torch_twin_through_optimwrapper():
    arguments = (("betas", (0.9, 0.99)), ("eps", 1e-05))
    adam = [OptimizerInfo("Adam", tensors=162, fastai_twin="AdamW", twin_arguments=arguments)]
    below = _summary(optimizer=OPTIMIZER_SHARE_ADVICE - 0.001)
    assert anatomy_advice(below, None, False, adam) == []
    at = _summary(optimizer=OPTIMIZER_SHARE_ADVICE)
    (finding,) = anatomy_advice(at, None, False, adam)
    assert finding.code == "fastai-optimizer"
    assert sentence(finding) == (
        "The optimizer step takes 15% of each step: fastai's own Adam updates its 162 parameter "
        "tensors one at a time, in Python. torch's AdamW makes the same update in one operation "
        "with fused=True; fastai takes it through OptimWrapper: Learner(..., "
        "opt_func=partial(OptimWrapper, opt=partial(torch.optim.AdamW, fused=True, "
        "betas=(0.9, 0.99), eps=1e-05)))."
    )
    radam = [OptimizerInfo("RAdam", tensors=162, fastai_twin="")]
    (finding,) = anatomy_advice(at, None, False, radam)  # no torch optimizer makes its update
    assert sentence(finding).endswith(
        "A torch.optim optimizer updates them together (foreach, its default, or fused=True "
        "where it has one); fastai takes one through OptimWrapper: Learner(..., "
        "opt_func=partial(OptimWrapper, opt=torch.optim.\u2026))."
    )
    untimed = _summary(optimizer=0.9)
    del untimed.phase_shares["forward"], untimed.phase_shares["backward"]
    assert anatomy_advice(untimed, None, False, adam) == []


class Scalars(torch.nn.Module):
    """Three hundred one-element parameters: an optimizer step of one small update each."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(1)) for _ in range(300))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack(list(self.p)).sum() * x.mean()


@pytest.mark.parametrize("fused", [False, True])
def test_a_real_run_records_its_optimizer_and_the_advice_follows_its_settings(fused):
    model = Scalars()
    settings = {"fused": True} if fused else {"foreach": False}
    opt = torch.optim.Adam(model.parameters(), **settings)
    loader = DataLoader(TensorDataset(torch.randn(640, 4)), batch_size=8)
    with traceml_nb.Run("optimizer", sample=False) as run:
        for (x,) in loader:
            model(x).backward()
            opt.step()
            opt.zero_grad()
    (info,) = run.record.optimizers
    assert (info.kind, info.tensors, info.can_fuse) == ("Adam", 300, not fused)
    assert info.fused is (True if fused else None)  # None: left to torch
    analysis = analyze(run.record.snapshot(), run.capabilities)
    codes = [f.code for f in analysis.diagnosis.advice]
    assert ("fused-optimizer" in codes) == (not fused)
    if not fused:  # a share this large only comes from the per-tensor loop
        assert analysis.summary.phase_shares["optimizer"] >= OPTIMIZER_SHARE_ADVICE


def test_a_subclass_of_a_fusable_optimizer_can_fuse_too():
    class MyAdam(torch.optim.Adam):
        pass

    info = optimizer_info(MyAdam([torch.nn.Parameter(torch.zeros(1))]))
    assert info.kind == "MyAdam" and info.fusable and info.can_fuse


def test_a_run_without_timed_phases_gets_no_anatomy_advice():
    assert _codes(make_summary(phase_shares={}, flop_precisions={}), _loader(False)) == []


def test_a_half_precision_less_than_the_gain_faster_is_not_advised(monkeypatch):
    from traceml_nb.analysis import anatomy_advice as rules

    summary = _summary()
    summary.flop_precisions, summary.flop_device = {"tf32": 1.0}, "NVIDIA A100-SXM4-40GB"
    assert "mixed-precision" in _codes(summary)  # bf16 312 / tf32 156: the gain exactly
    monkeypatch.setattr(rules, "HALF_PRECISION_GAIN", HALF_PRECISION_GAIN + 0.01)
    assert "mixed-precision" not in _codes(summary)


@pytest.mark.parametrize(
    ("conv", "nhwc", "precisions", "advised"),
    [
        (CONV_SHARE_ADVICE, 0.0, {"fp16": 1.0}, True),
        (CONV_SHARE_ADVICE - 0.01, 0.0, {"fp16": 1.0}, False),  # not mostly convolutions
        (0.9, MOSTLY, {"bf16": 1.0}, False),  # channels_last already
        (0.9, MOSTLY - 0.01, {"tf32": 1.0}, True),
        (0.9, None, {"fp32": 1.0}, False),  # fp32: mixed precision first
        (0.9, 0.0, {"fp16": MOSTLY, "fp32": 1 - MOSTLY}, True),
    ],
)
def test_convolutions_on_tensor_cores_in_nchw_ask_for_channels_last(
    conv, nhwc, precisions, advised
):
    summary = _summary()
    summary.conv_share, summary.channels_last_share = conv, nhwc
    summary.flop_precisions, summary.flop_device = precisions, "Tesla T4"
    assert ("channels-last" in _codes(summary, _loader(True))) is advised
    assert "channels-last" not in _codes(summary, _loader(True), gpu=False)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_count_tells_convolutions_and_their_memory_format(channels_last):
    from traceml_nb.engine.instrument.flop_count import _counter

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.Flatten(), torch.nn.LazyLinear(4)
    )
    x = torch.randn(4, 3, 16, 16)
    model(x)
    if channels_last:
        model, x = (
            model.to(memory_format=torch.channels_last),
            x.to(memory_format=torch.channels_last),
        )
    counter = _counter()
    with counter:
        model(x).sum().backward()
    assert 0 < counter.conv_flops < counter.get_total_flops()
    assert counter.channels_last_flops == (counter.conv_flops if channels_last else 0)
