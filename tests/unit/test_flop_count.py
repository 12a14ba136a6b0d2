"""The FLOPs of one training step, counted once per run with FlopCounterMode: the count equals
FlopCounterMode run by hand on the same step, the counted step is left out of the statistics,
and each case without a count says why."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.analysis.steps import select_rows
from traceml_nb.engine import flop_capture
from traceml_nb.engine.flop_capture import EVALUATION_COUNTED
from traceml_nb.engine.instrument import flop_count
from traceml_nb.engine.record import FLAG_FLOP_COUNTED


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )


def _loader(n: int = 96) -> DataLoader:
    data = TensorDataset(torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,)))
    return DataLoader(data, batch_size=8)


def _step(model, opt, x, y) -> None:
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _dispatch_modes() -> int:
    return int(torch._C._len_torch_dispatch_stack())


@pytest.fixture(autouse=True)
def nothing_compiled(monkeypatch) -> None:
    """As in a process that never compiled a model (another test of the suite may have)."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)


def test_the_count_is_flop_counter_mode_on_the_same_step_and_that_step_is_left_out() -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    with traceml_nb.Run("flops", sample=False) as run:
        for x, y in _loader():
            _step(model, opt, x, y)
    x, y = next(iter(_loader()))
    with FlopCounterMode(display=False) as by_hand:
        _step(model, opt, x, y)
    count = run.record.flops
    assert count is not None and count.why == ""
    assert count.flops == pytest.approx(by_hand.get_total_flops(), rel=0.05)
    assert count.flops > 0 and _dispatch_modes() == 0
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flop_counted_steps == summary.flop_window_steps == 1
    assert summary.flops_per_step == count.flops
    compute_s = summary.compute_ms_median / 1e3  # the median rest of the steady steps
    assert summary.achieved_tflops == pytest.approx(count.flops / compute_s / 1e12)
    assert summary.mfu is None and "CPU" in summary.unavailable["mfu"]


def _train_with_a_gradient_penalty() -> list[float]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for x, y in _loader(48):
        x.requires_grad_(True)
        out = model(x)
        (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        loss = torch.nn.functional.cross_entropy(out, y) + grad.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_step_taking_the_gradient_of_its_input_runs_as_without_the_run_and_is_counted() -> None:
    """``torch.autograd.grad`` of the model's output with respect to its input (a WGAN-GP's
    gradient penalty, a physics-informed loss): FlopCounterMode's module tracker makes that
    step raise "A leaf node was passed to _will_engine_execute_node"; the count attributes no
    FLOPs to modules, so the user's step runs as it does without a run."""
    plain = _train_with_a_gradient_penalty()
    with traceml_nb.Run("penalty") as run:
        traced = _train_with_a_gradient_penalty()
    assert run.status == "completed" and traced == plain
    model = _model()
    x, y = next(iter(_loader()))
    with FlopCounterMode(display=False) as without_penalty:
        _step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
    count = run.record.flops
    assert count is not None and count.why == ""
    assert count.flops > without_penalty.get_total_flops()  # the penalty's double backward too


def test_under_gradient_accumulation_the_count_over_a_cycle_is_divided_by_its_steps() -> None:
    """The count spans one optimizer step's cycle: 4 batches of forward and backward, then the
    step. Per step (a batch, as every other figure) it is a quarter of that, as FlopCounterMode
    counts one plain step by hand; the FLOP/s and the MFU follow from it, not 4x."""
    accumulation = 4
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run("accumulation", sample=False) as run:
        for i, (x, y) in enumerate(_loader(8 * 40)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if i % accumulation == accumulation - 1:
                opt.step()
                opt.zero_grad()
    x, y = next(iter(_loader()))
    with FlopCounterMode(display=False) as by_hand:
        _step(model, opt, x, y)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flop_window_steps == accumulation
    assert summary.flops_per_step == pytest.approx(by_hand.get_total_flops(), rel=0.05)
    assert run.record.flops.flops == pytest.approx(accumulation * summary.flops_per_step)
    compute_s = summary.compute_ms_median / 1e3
    assert summary.achieved_tflops == pytest.approx(summary.flops_per_step / compute_s / 1e12)
    assert "(counted over 4 steps, their mean)" in str(run.result())


def _train_evaluating(every: int, at: int, *, top: bool = False) -> traceml_nb.Run:
    """48 steps, evaluating on a loader of its own under ``torch.no_grad()`` after the steps
    with ``i % every == at`` (``top``: before them)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def evaluate() -> None:
        with torch.no_grad():
            for vx, _ in _loader(64):
                model(vx)

    with traceml_nb.Run("evaluated", sample=False) as run:
        for i, (x, y) in enumerate(_loader(384)):
            if top and i % every == at:
                evaluate()
            _step(model, opt, x, y)
            if not top and i % every == at:
                evaluate()
    return run


def _by_hand() -> float:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = next(iter(_loader()))
    with FlopCounterMode(display=False) as by_hand:
        _step(model, opt, x, y)
    return float(by_hand.get_total_flops())


@pytest.mark.parametrize("at", [0, 5])
def test_an_evaluation_inside_the_count_has_the_next_step_counted_instead(at: int) -> None:
    """``if i % 10 == 0: evaluate()`` after the optimizer step runs an evaluation right after
    the first step, inside the count (which opens there): that count is given up and the next
    step counted; both tries' steps are left out. An evaluation elsewhere (``at`` 5) leaves the
    first count as it is."""
    run = _train_evaluating(10, at)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.interleaved_steps >= 4
    assert summary.flops_per_step == pytest.approx(_by_hand(), rel=0.05)
    assert summary.flop_window_steps == 1
    counted = np.flatnonzero(select_rows(run.record.snapshot()).flags & FLAG_FLOP_COUNTED)
    first = flop_count.COUNT_AFTER_STEPS
    assert list(counted) == ([first, first + 1] if at == 0 else [first])


def test_an_evaluation_in_every_step_tried_leaves_the_flops_unavailable_not_inflated() -> None:
    run = _train_evaluating(1, 0)
    assert run.record.flops is not None and run.record.flops.why == EVALUATION_COUNTED
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flops_per_step is None and summary.achieved_tflops is None
    assert summary.unavailable["flops_per_step"] == EVALUATION_COUNTED
    assert summary.unavailable["mfu"] == EVALUATION_COUNTED
    counted = np.flatnonzero(select_rows(run.record.snapshot()).flags & FLAG_FLOP_COUNTED)
    assert len(counted) == flop_count.FLOP_COUNT_TRIES


def test_a_try_that_cannot_start_keeps_the_steps_the_first_one_slowed_left_out(
    monkeypatch,
) -> None:
    """The count caught an evaluation and the next try cannot start (a model was compiled in
    between): no count, with why, and the first try's step is still left out."""
    calls = iter([False, True])
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: next(calls, True))
    run = _train_evaluating(10, 0)
    assert run.record.flops is not None and run.record.flops.why == flop_capture.COMPILED
    counted = np.flatnonzero(select_rows(run.record.snapshot()).flags & FLAG_FLOP_COUNTED)
    assert list(counted) == [flop_count.COUNT_AFTER_STEPS]


def test_an_evaluation_at_the_top_of_the_loop_before_the_count_leaves_it_as_it_is() -> None:
    """``if i % 10 == 0: evaluate()`` before the step: the evaluation of step 0 runs before the
    count opens (at step 0's optimizer step), though inside the step row the count's window
    overlaps: the first count stands."""
    run = _train_evaluating(10, 0, top=True)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.interleaved_steps == 5
    assert summary.flops_per_step == pytest.approx(_by_hand(), rel=0.05)
    counted = np.flatnonzero(select_rows(run.record.snapshot()).flags & FLAG_FLOP_COUNTED)
    assert list(counted) == [flop_count.COUNT_AFTER_STEPS]


def _train_on_tensors(
    evaluate_every: int | None, *, pseudo_labels: bool = False, teacher: bool = False
) -> tuple[traceml_nb.Run, float]:
    """24 steps on tensors (no DataLoader), and the FLOPs of one step counted by hand. After
    the steps with ``i % evaluate_every == 0``, an evaluation of the model on 64 validation
    images under ``torch.no_grad()``; in each step, before the training forward, the model
    (``pseudo_labels``) or a frozen copy no optimizer holds (``teacher``) called without
    autograd on the batch."""
    model = _model()
    frozen = _model().eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(24, 8, 3, 8, 8)
    labels = torch.randint(0, 10, (24, 8))
    val = torch.randn(64, 3, 8, 8)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.no_grad():
            if pseudo_labels:
                model(x)
            if teacher:
                frozen(x)
        _step(model, opt, x, y)

    with traceml_nb.Run("on tensors", sample=False) as run:
        for i in range(24):
            train_step(data[i], labels[i])
            if evaluate_every and i % evaluate_every == 0:
                model.eval()
                with torch.no_grad():
                    model(val)
                model.train()
    with FlopCounterMode(display=False) as by_hand:
        train_step(data[0], labels[0])
    return run, float(by_hand.get_total_flops())


def _flop_counted_rows(run: traceml_nb.Run) -> list[int]:
    return list(np.flatnonzero(select_rows(run.record.snapshot()).flags & FLAG_FLOP_COUNTED))


def test_an_evaluation_on_tensors_inside_the_count_has_the_next_step_counted_instead() -> None:
    """``with torch.no_grad(): model(X_val)`` after the first optimizer step, no DataLoader to
    tell it: the count saw the model the optimizer trains called without autograd (16x the
    step's FLOPs here, counted as the step's before), and counts the next step."""
    run, by_hand = _train_on_tensors(10)
    assert run.record.flops is not None
    assert run.record.flops.flops == pytest.approx(by_hand, rel=0.01)
    first = flop_count.COUNT_AFTER_STEPS
    assert _flop_counted_rows(run) == [first, first + 1]
    assert _dispatch_modes() == 0 and not torch.nn.modules.module._global_forward_pre_hooks


@pytest.mark.parametrize("evaluate_every", [None, 2])
def test_a_model_called_without_autograd_in_every_step_is_the_steps_own_work(
    evaluate_every: int | None,
) -> None:
    """Pseudo-labels from the model under ``torch.no_grad()`` in each step: every try sees
    the call, so it is part of the step, and the smallest count stands (with an evaluation
    every other step too, the try without it)."""
    run, by_hand = _train_on_tensors(evaluate_every, pseudo_labels=True)
    assert run.record.flops is not None
    assert run.record.flops.flops == pytest.approx(by_hand, rel=0.01)
    assert len(_flop_counted_rows(run)) == flop_count.FLOP_COUNT_TRIES
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flops_per_step == pytest.approx(by_hand, rel=0.01)


def test_a_frozen_model_called_without_autograd_is_counted_on_the_first_try() -> None:
    """A teacher no optimizer holds is the step's: the first count stands."""
    run, by_hand = _train_on_tensors(None, teacher=True)
    assert run.record.flops is not None
    assert run.record.flops.flops == pytest.approx(by_hand, rel=0.01)
    assert _flop_counted_rows(run) == [flop_count.COUNT_AFTER_STEPS]


def test_a_long_end_of_the_step_before_the_count_does_not_make_it_counted() -> None:
    """The count opens at an optimizer step's end; what the loop does after that step (here a
    30 ms sleep, as a busy machine's preemption there would be) is the end of a step that began
    before the count: only the step that began inside the count is left out."""
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    with traceml_nb.Run("flops", sample=False) as run:
        for i, (x, y) in enumerate(_loader()):
            _step(model, opt, x, y)
            if i == flop_count.COUNT_AFTER_STEPS - 1:  # the count has just opened
                time.sleep(0.03)
    selection = select_rows(run.record.snapshot())
    counted = np.flatnonzero(selection.flags & FLAG_FLOP_COUNTED)
    assert list(counted) == [flop_count.COUNT_AFTER_STEPS]  # the step after the sleep's
    assert selection.wall_ms[flop_count.COUNT_AFTER_STEPS - 1] >= 30  # the sleep's own step


def test_a_loop_without_an_optimizer_step_has_no_count_and_says_why() -> None:
    model = _model()
    with traceml_nb.Run("eval", sample=False) as run, torch.no_grad():
        for x, _ in _loader(32):
            model(x)
    assert run.record.flops == flop_capture.FlopCount(why=flop_capture.NO_OPTIMIZER)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flops_per_step is None
    assert summary.unavailable["flops_per_step"] == flop_capture.NO_OPTIMIZER


def test_a_run_that_ends_inside_the_counted_step_leaves_no_counter_behind() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt), traceml_nb.Run("stopped", sample=False) as run:
        for i, (x, y) in enumerate(_loader()):
            _step(model, opt, x, y)
            if i == flop_count.COUNT_AFTER_STEPS - 1:  # the count has just begun
                assert _dispatch_modes() == 1
                raise KeyboardInterrupt
    assert _dispatch_modes() == 0
    assert run.record.flops is not None and run.record.flops.why == flop_capture.ENDED


def test_a_process_that_compiled_a_model_counts_nothing(monkeypatch) -> None:
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: True)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with traceml_nb.Run("compiled", sample=False) as run:
        for x, y in _loader(32):
            _step(model, opt, x, y)
    assert run.record.flops == flop_capture.FlopCount(why=flop_capture.COMPILED)
    assert _dispatch_modes() == 0


def test_the_count_tells_the_precision_the_flops_ran_in() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run("bf16", sample=False) as run:
        for x, y in _loader():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            torch.nn.functional.cross_entropy(out.float(), y).backward()
            opt.step()
            opt.zero_grad()
    count = run.record.flops
    assert count is not None and count.device == "cpu"
    assert set(count.by_dtype) == {"bf16"} and sum(count.by_dtype.values()) == count.flops
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flop_precisions == {"bf16": 1.0}
    assert summary.mfu is None and summary.unavailable["mfu"] == "no peak FLOP/s is known for a CPU"


@pytest.mark.parametrize(
    ("capability", "precision", "conv"), [((7, 5), "fp32", "fp32"), ((8, 0), "tf32", "tf32")]
)
def test_float32_on_a_gpu_counts_as_tf32_where_its_tensor_cores_and_torch_allow(
    monkeypatch, capability, precision, conv
) -> None:
    """A fake CUDA tensor: float32 is tf32 from compute capability 8.0 with a matmul precision
    other than "highest" (convolutions: cudnn.allow_tf32; a matrix-vector product never), and
    the device is named as CUDA names it."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    tensor = SimpleNamespace(dtype=torch.float32, device=torch.device("cuda", 0))
    half = SimpleNamespace(dtype=torch.float16, device=torch.device("cuda", 0))
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        counter = flop_count._counter()
        assert counter._precision(torch.ops.aten.mm, tensor) == precision
        assert counter._precision(torch.ops.aten.convolution, tensor) == conv
        assert counter._precision(torch.ops.aten.mm, half) == "fp16"
        assert counter._precision(torch.ops.aten.mv, tensor) == "fp32"  # no tensor cores
        assert counter.device == "NVIDIA A100-SXM4-40GB"
        torch.set_float32_matmul_precision("highest")
        assert flop_count._counter()._precision(torch.ops.aten.mm, tensor) == "fp32"
    finally:
        torch.set_float32_matmul_precision(previous)


def test_the_mfu_of_a_counted_gpu_step_is_against_its_peak() -> None:
    """A run's record with the count a T4 in fp16 would give: the summary's MFU is the
    achieved FLOP/s over the T4's fp16 peak, and the report says of which peak."""
    from dataclasses import replace

    from traceml_nb.views.text import _mfu

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run("t4", sample=False) as run:
        for x, y in _loader():
            _step(model, opt, x, y)
    count = run.record.flops
    assert count is not None and count.flops
    run.record.flops = replace(count, by_dtype={"fp16": count.flops}, device="Tesla T4")
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.mfu_peak_tflops == 65.0
    assert summary.mfu == pytest.approx(summary.achieved_tflops / 65.0)
    assert _mfu(summary, summary.mfu).endswith("(of a 65 TFLOP/s peak: fp16)")
