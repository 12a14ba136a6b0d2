"""A model compiled in place (``model.compile()``) or made a TorchScript module trains under a
run as it does without one: compiled as often, saved and copied as it is, never an error of
ours; its forward timed where our hooks can run, and unavailable, with why, where they cannot.
(``torch.compile(model)``'s wrapper: ``test_reliability_engine.test_torch_compiled_model``.)"""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.analysis.step_anatomy import NO_COPY_WITHOUT_FORWARD, NO_FORWARD, NO_OPTIMIZER
from traceml_nb.analysis.steps import select_rows
from traceml_nb.engine.instrument import compilation, step_phases
from traceml_nb.engine.instrument.step_phases import NO_HOOKS, StepPhases
from traceml_nb.views.text import metric_lines


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class CountingBackend:
    """A ``torch.compile`` backend that runs the graph as it is and counts the graphs."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture(autouse=True)
def every_other_step(monkeypatch) -> None:
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 0.0)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def train(model, run_name: str | None, *, snapshots: list | None = None) -> traceml_nb.Run | None:
    """40 steps of a plain loop, in a run unless ``run_name`` is None; after each optimizer
    step the model is saved whole (a TorchScript module: with ``torch.jit.save``) and, with
    ``snapshots``, deep-copied, as loops checkpoint."""
    save = torch.jit.save if isinstance(model, torch.jit.ScriptModule) else torch.save
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
    run = traceml_nb.Run(run_name, sample=False) if run_name else None
    with run if run is not None else contextlib.nullcontext():
        for x, y in DataLoader(data, batch_size=8):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            save(model, io.BytesIO())
            if snapshots is not None:
                snapshots.append(copy.deepcopy(model))
    return run


def our_hook_codes() -> list:
    """The code objects of the phase instruments' module hooks (a run sets how torch.compile
    runs them)."""
    phases = StepPhases([], lambda: 0, lambda: None, 1 << 20)
    phases.install()
    try:
        hooks = (phases._forward_starts, phases._forward_ends, phases._arm)
        return [f.__code__ for f in (*hooks, phases._seek_pre, phases._seek_post)]
    finally:
        phases.remove()


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_model_compiled_in_place_compiles_once_and_has_its_forward_timed(fullgraph) -> None:
    """``model.compile()`` compiles the module's call: its hooks are called inside the compiled
    call. Before, torch.compile compiled our hooks too, into hooks that did nothing: the
    forward and the input copy read 0 ms and the forward compiled twice (the global hooks
    seeking the model were still in place at its first compile)."""
    plain_backend, traced_backend = CountingBackend(), CountingBackend()
    plain = Net()
    plain.compile(backend=plain_backend, fullgraph=fullgraph)
    train(plain, None)
    torch._dynamo.reset()
    model, snapshots = Net(), []
    model.compile(backend=traced_backend, fullgraph=fullgraph)
    run = train(model, "compiled in place", snapshots=snapshots)
    assert traced_backend.graphs == plain_backend.graphs == 1
    assert not any(s._forward_pre_hooks or s._forward_hooks for s in snapshots)
    timed = select_rows(run.record.snapshot(samples=False)).phase_ms.values
    assert len(timed) >= 10 and (timed[:, 1] > 0).all()  # the forward of every sampled step
    summary = analyze(run.snapshot(), run.capabilities).summary
    assert summary.forward_ms_median > 0 and summary.copy_ms_median > 0


def test_where_torch_cannot_run_our_hooks_as_they_are_the_forward_is_unavailable(
    monkeypatch,
) -> None:
    """A torch without the setting (before 2.6): our hooks inside the compiled call compile
    to nothing, as before; the forward and the copy are then unavailable, with why, not 0 ms,
    and the backward and the optimizer step are still timed."""
    from torch._C._dynamo import eval_frame

    default = eval_frame._FrameAction.DEFAULT
    for code in our_hook_codes():  # as a process that never ran a run would have them
        eval_frame.set_code_exec_strategy(code, eval_frame._FrameExecStrategy(default, default))
    monkeypatch.delattr(eval_frame, "set_code_exec_strategy")
    assert not compilation.run_as_they_are(train)
    model = Net()
    model.compile(backend=CountingBackend())
    run = train(model, "compiled in place, older torch")
    timed = select_rows(run.record.snapshot(samples=False)).phase_ms.values
    assert len(timed) >= 10 and not timed[:, :2].any() and (timed[:, 2] > 0).all()
    summary = analyze(run.snapshot(), run.capabilities).summary
    assert summary.forward_ms_median is None and summary.copy_ms_median is None
    assert summary.unavailable["forward_ms_median"] == NO_FORWARD
    assert summary.unavailable["copy_ms_median"] == NO_COPY_WITHOUT_FORWARD
    assert summary.backward_ms_median > 0 and summary.other_ms_median > 0
    assert set(summary.phase_shares) == {"data_wait", "backward", "optimizer", "other"}
    assert sum(summary.phase_shares.values()) == pytest.approx(1.0)


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
@pytest.mark.parametrize("make", ["torch.jit.script", "torch.jit.trace"])
def test_a_torchscript_model_trains_as_without_the_run(make) -> None:
    """A scripted module takes no hooks of its own: putting ours on it raised
    ``RuntimeError: register_forward_pre_hook is not supported on ScriptModules`` into the
    user's forward (the first sampled step after the model was found). Now it is not timed,
    the run says so, and the report gives its forward as unavailable. A traced module takes
    hooks, and its forward is timed as an eager one's."""
    net = Net()
    if make == "torch.jit.script":
        model = torch.jit.script(net)
    else:
        model = torch.jit.trace(net, torch.randn(2, 8))
    run = train(model, make)
    assert run.status == "completed"
    timed = select_rows(run.record.snapshot(samples=False)).phase_ms.values
    assert len(timed) >= 10 and np.all(timed[:, 2] > 0)
    summary = analyze(run.snapshot(), run.capabilities).summary
    assert summary.backward_ms_median > 0
    note = NO_HOOKS.format(name=type(model).__name__)
    if make == "torch.jit.script":
        assert run.capabilities.notes.count(note) == 1
        assert not timed[:, :2].any() and summary.forward_ms_median is None
        assert summary.unavailable["forward_ms_median"] == NO_FORWARD
        lines = {m.label: m for m in metric_lines(summary, run.capabilities)}
        line = lines["step phases (median, share)"]
        assert line.available and line.text.startswith("backward ")  # the first part timed
        assert f"; forward unavailable ({NO_FORWARD})" in line.text
    else:
        assert note not in run.capabilities.notes
        assert (timed[:, 1] > 0).all() and summary.forward_ms_median > 0


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")  # torch's own Adam
def test_an_optimizer_step_compiled_with_torch_compile_compiles_once() -> None:
    """``torch.compile`` of a function that steps the optimizer (PyTorch's own recipe): it
    traces our global pre-step hook, and its graph holds while the global optimizer hooks stay
    as they were. Before, the hook came and went with each sample, and every sample compiled
    the step again until torch's recompile limit (8) made it warn and run the step uncompiled.
    Now the hook stays until the run's end once a compile traced it; the optimizer phase,
    which a compiled step does not time, is unavailable, with why, not 0 ms."""
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")
    def step() -> None:
        opt.step()

    data = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
    with (
        torch._dynamo.config.patch(error_on_recompile=True),
        traceml_nb.Run("compiled optimizer step", sample=False) as run,
    ):
        for x, y in DataLoader(data, batch_size=8):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            step()
            opt.zero_grad()
    assert run.status == "completed"
    timed = select_rows(run.record.snapshot(samples=False)).phase_ms.values
    assert len(timed) >= 10 and (timed[:, 1] > 0).all() and not timed[:, 3].any()
    summary = analyze(run.snapshot(), run.capabilities).summary
    assert summary.optimizer_ms_median is None
    assert summary.unavailable["optimizer_ms_median"] == NO_OPTIMIZER
    assert summary.forward_ms_median > 0 and summary.backward_ms_median > 0


def test_a_function_compiled_with_torch_compile_that_calls_the_model() -> None:
    """``torch.compile(loss_of)``, which calls the model: the model's call is traced, with the
    global hooks that seek the model in it (doing nothing there), so its forward is not seen
    and is unavailable, with why; the function compiles once more when those hooks go at the
    first optimizer step (torch guards on the number of global module hooks), and no more."""
    backend, model = CountingBackend(), Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend=backend)
    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)

    data = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
    with traceml_nb.Run("compiled function", sample=False) as run:
        for x, y in DataLoader(data, batch_size=8):
            loss_of(x, y).backward()
            opt.step()
            opt.zero_grad()
    assert backend.graphs == 2
    summary = analyze(run.snapshot(), run.capabilities).summary
    assert summary.forward_ms_median is None
    assert summary.unavailable["forward_ms_median"] == NO_FORWARD
    assert summary.backward_ms_median > 0 and summary.optimizer_ms_median > 0
