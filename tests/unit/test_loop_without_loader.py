"""A CPU loop that iterates no DataLoader (nanoGPT's ``get_batch()``, tensors sliced in
memory): no data wait is measured, so the verdict comes from the model's timed phases, which
bound the time the batches can take."""

from __future__ import annotations

import time

import pytest
import torch
from builders import RecordBuilder, cpu_capabilities

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.analysis.thresholds import INPUT_BOUND_SHARE, MODEL_BOUND_SHARE
from traceml_nb.engine.record import FLAG_OPTIMIZER_STEP, SOURCE_OPTIMIZER
from traceml_nb.views.diagnosis_words import diagnosis_words


def _optimizer_steps(model_share: float, steps: int = 50, step_ms: float = 10.0):
    """A record of optimizer-step rows, each with its phases timed: forward, backward and
    optimizer ``model_share`` of the step, the rest other."""
    b = RecordBuilder()
    step_ns = int(step_ms * 1e6)
    model_ns = int(round(step_ns * model_share))
    forward, optimizer = model_ns // 4, model_ns // 8
    phases = (0, forward, model_ns - forward - optimizer, optimizer)  # PHASE_COLUMNS
    rows = [
        (i * step_ns, step_ns, 0, -1, SOURCE_OPTIMIZER, FLAG_OPTIMIZER_STEP) for i in range(steps)
    ]
    b.record.steps.extend(rows, [phases] * steps)
    b.record.optimizer_steps = steps
    b.t_ns = steps * step_ns
    return analyze(b.finish(), cpu_capabilities(host=False), warmup=0).diagnosis


def test_the_model_phases_taking_nearly_all_of_each_step_make_it_compute_bound_both_sides():
    assert pytest.approx(1.0 - INPUT_BOUND_SHARE) == MODEL_BOUND_SHARE  # the rest: not input
    d = _optimizer_steps(MODEL_BOUND_SHARE)
    assert d.verdict == "compute-bound"
    assert diagnosis_words(d).title == (
        "Compute-bound: the model's forward, backward and optimizer step take 85% of each "
        "step; no DataLoader was iterated, so making the batches is inside the other 15%"
    )
    assert diagnosis_words(d).advice[0].startswith("The CPU computing the model is the limit")
    below = _optimizer_steps(MODEL_BOUND_SHARE - 0.01)
    assert below.verdict == "insufficient-data"
    assert diagnosis_words(below).title == (
        "Cannot judge: no DataLoader was iterated and no GPU utilisation was measured"
    )


def _train(make_batch) -> traceml_nb.Run:
    torch.manual_seed(0)
    model = torch.nn.Sequential(  # a step of several ms: the loop's own Python is ~0.2 ms
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.Linear(1024, 8),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run("no loader", sample=False) as run:
        for _ in range(30):
            x, y = make_batch()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return run


def test_a_real_loop_slicing_tensors_in_memory_is_compute_bound_and_one_making_slow_batches_not():
    data, labels = torch.randn(4096, 64), torch.randint(0, 8, (4096,))

    def sliced():
        i = torch.randint(0, 4096 - 256, ()).item()
        return data[i : i + 256], labels[i : i + 256]

    def slow():  # a batch made by hand, item by item: as long as the model's step or longer
        time.sleep(0.02)
        return sliced()

    fast = _train(sliced)
    assert analyze(fast.record.snapshot(), fast.capabilities).diagnosis.verdict == "compute-bound"
    waits = _train(slow)
    verdict = analyze(waits.record.snapshot(), waits.capabilities).diagnosis.verdict
    assert verdict == "insufficient-data"
