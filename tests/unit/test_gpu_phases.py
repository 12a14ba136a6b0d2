"""The phases' GPU time from CUDA events, on a simulated GPU timeline (``fake_cuda``): a real
model, autograd and optimizer whose forward, backward and step queue known GPU work; real hooks,
tracer, segmenter and ledger. Only the events are fakes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from fake_cuda import FakeTimeline
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.analysis.pipeline import analyze
from traceml_nb.analysis.steps import StepRule
from traceml_nb.engine.events import BACKWARD, FORWARD, OPTIMIZER, PHASE
from traceml_nb.engine.instrument import flop_count, step_phases
from traceml_nb.engine.instrument.tracer import CHECK_EVERY
from traceml_nb.engine.options import Backends
from traceml_nb.engine.phase_ledger import PhaseLedger
from traceml_nb.views.live.data import StepRows
from traceml_nb.views.text import _step_phases

#: GPU work each phase queues, ms
COPY_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 2.0, 3.0, 6.0, 1.0


class Queued(torch.autograd.Function):
    """Identity whose forward and backward queue GPU work on the timeline."""

    @staticmethod
    def forward(ctx, x, timeline: FakeTimeline):  # type: ignore[override]
        timeline.launch(FORWARD_MS)
        ctx.timeline = timeline
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.timeline.launch(BACKWARD_MS)
        return grad, None


class Model(torch.nn.Module):
    def __init__(self, timeline: FakeTimeline) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.timeline = timeline

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Queued.apply(self.linear(x), self.timeline)


class QueuedSGD(torch.optim.Optimizer):
    """Plain SGD whose step queues GPU work (its own step: torch hooks it once)."""

    def __init__(self, params, timeline: FakeTimeline) -> None:
        super().__init__(params, {"lr": 0.01})
        self.timeline = timeline

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            with torch.enable_grad():
                closure()
        self.timeline.launch(OPTIMIZER_MS)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


@pytest.fixture(autouse=True)
def often(monkeypatch) -> None:
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 0.0)  # every other step sampled
    monkeypatch.setattr(step_phases, "FIRST_SKIP", 1)


def _train(timeline: FakeTimeline, steps: int, host_ms: float) -> traceml_nb.Run:
    model = Model(timeline)
    opt = QueuedSGD(model.parameters(), timeline)
    loader = DataLoader(TensorDataset(torch.randn(steps * 4, 4)), batch_size=4)
    backends = Backends(event_factory=timeline.event, stream_getter=timeline.current_stream)
    with traceml_nb.Run("gpu-phases", sample=False, backends=backends) as run:
        for (x,) in loader:
            timeline.launch(COPY_MS)  # what ``x.cuda()`` queues
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            timeline.host(host_ms)
    return run


@pytest.mark.parametrize("host_ms", [0.5, 30.0], ids=["gpu-bound", "host-bound"])
def test_each_phase_gets_the_gpu_time_it_queued(host_ms: float) -> None:
    timeline = FakeTimeline()
    run = _train(timeline, 40, host_ms)
    cols = run.record.steps.snapshot()
    gpu = cols.gpu_phases.dense(len(cols))
    host = cols.phases.dense(len(cols))
    timed = np.isfinite(gpu).all(axis=1)
    assert timed.sum() >= 10
    truth = [COPY_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS]
    assert gpu[timed] == pytest.approx(np.tile(truth, (timed.sum(), 1)))
    # GPU phases only where the host phases were timed, and beside them
    assert not (timed & ~np.isfinite(host).all(axis=1)).any()
    assert timeline.syncs == 1  # no synchronisation per step: the one at the run's end


def test_a_closures_copy_of_the_batch_is_the_copys_gpu_time_not_the_updates() -> None:
    """``optimizer.step(closure)`` whose closure copies the batch before the model (skorch's
    ``to_tensor``): on the GPU too the copy is from the batch's arrival to the forward, the
    optimizer the update alone (it read the copy's 2 ms as well), and the events go back."""
    timeline = FakeTimeline()
    model = Model(timeline)
    opt = QueuedSGD(model.parameters(), timeline)
    backends = Backends(event_factory=timeline.event, stream_getter=timeline.current_stream)
    with traceml_nb.Run("closure", sample=False, backends=backends) as run:
        for (x,) in DataLoader(TensorDataset(torch.randn(160, 4)), batch_size=4):

            def closure(x=x):
                timeline.launch(COPY_MS)  # what ``x.cuda()`` queues, inside the closure
                opt.zero_grad()
                model(x).sum().backward()

            opt.step(closure)
            timeline.host(30.0)
    cols = run.record.steps.snapshot()
    gpu = cols.gpu_phases.dense(len(cols))
    timed = np.isfinite(gpu).all(axis=1)
    assert timed.sum() >= 10
    truth = [COPY_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS]
    assert gpu[timed] == pytest.approx(np.tile(truth, (timed.sum(), 1)))
    assert timeline.unread_rerecords == 0


def test_the_phases_events_go_back_to_the_pool() -> None:
    # the GPU keeps up: the steps resolve a few behind whenever the log is processed (every
    # CHECK_EVERY fetches without a reader), and their events go back
    short, long = FakeTimeline(), FakeTimeline()
    _train(short, 3 * CHECK_EVERY, 30.0)
    _train(long, 10 * CHECK_EVERY, 30.0)
    assert long.created == short.created  # warm: the longer run makes no more events
    assert long.records > 3 * long.created
    assert long.unread_rerecords == 0  # every phase's events read before they were reused


def test_a_phase_whose_event_failed_leaves_its_step_without_gpu_phases() -> None:
    ledger = PhaseLedger()
    ledger.turned((0, True))
    mark = ledger.mark()
    ledger.phase((PHASE, FORWARD, 10, 20, "s1", "e1"))
    ledger.phase((PHASE, BACKWARD, 20, 40, "s2", None))  # its end event could not be recorded
    phases, gone = ledger.gpu_of_step(mark)
    assert phases is None and sorted(gone) == ["e1", "s1", "s2"]
    ledger.phase((PHASE, OPTIMIZER, 40, 45, "s3", "e3"))
    mark_after = ledger.mark()
    ledger.phase((PHASE, FORWARD, 50, 60, "s4", "e4"))
    phases, gone = ledger.gpu_of_step(mark_after)  # claims what came after its start
    assert phases == ((FORWARD, "s4", "e4"),) and gone == ["s3", "e3"]
    assert not ledger.gpu_pending


def test_off_cuda_the_phases_carry_no_events_and_no_gpu_columns() -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run("cpu-phases", sample=False) as run:
        for (x,) in DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=4):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    cols = run.record.steps.snapshot()
    assert len(cols.phases) and np.isfinite(cols.phases.values).all()
    assert np.isnan(cols.gpu_phases.values[:, 1]).all()  # no GPU forward


@pytest.mark.parametrize("host_ms", [0.5, 30.0], ids=["gpu-bound", "host-bound"])
def test_the_report_gives_the_gpu_time_of_each_phase_and_the_gpu_stall_as_the_wait(
    host_ms: float,
) -> None:
    run = _train(FakeTimeline(), 60, host_ms)
    summary = analyze(run.record, run.capabilities, warmup=2).summary
    assert summary.phases_on_gpu
    medians = [
        summary.copy_ms_median,
        summary.forward_ms_median,
        summary.backward_ms_median,
        summary.optimizer_ms_median,
    ]
    assert medians == pytest.approx([COPY_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS])
    shares = summary.phase_shares
    assert sum(shares.values()) == pytest.approx(1.0)
    assert _step_phases(summary, 0.0).startswith("GPU time: copy 2 ms (")
    gpu_ms = COPY_MS + FORWARD_MS + BACKWARD_MS + OPTIMIZER_MS
    if host_ms < gpu_ms:  # the GPU is the limit: its phases fill the steps, it never waits
        assert shares["data_wait"] == pytest.approx(0.0, abs=0.01)
        assert shares["backward"] == pytest.approx(BACKWARD_MS / gpu_ms, rel=0.1)
    else:  # the host is: the GPU waits after each step, its phases are a part of the step
        assert shares["backward"] == pytest.approx(BACKWARD_MS / host_ms, rel=0.01)
        assert shares["other"] == pytest.approx((host_ms - gpu_ms) / host_ms, rel=0.01)


def test_without_a_dataloader_the_gpu_phases_are_unavailable_and_say_why() -> None:
    timeline = FakeTimeline()
    model = Model(timeline)
    opt = QueuedSGD(model.parameters(), timeline)
    backends = Backends(event_factory=timeline.event, stream_getter=timeline.current_stream)
    x = torch.randn(4, 4)
    with traceml_nb.Run("no-loader", sample=False, backends=backends) as run:
        for _ in range(30):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            timeline.host(20.0)
    summary = analyze(run.record, run.capabilities, warmup=2).summary
    assert not summary.phases_on_gpu and summary.forward_ms_median is None
    assert "DataLoader" in summary.unavailable["forward_ms_median"]
    pool = run.tracer.gpu.pool  # the phases' events no step claimed went back to the pool
    assert pool.created == len(pool.free) > 0


def test_the_live_chart_splits_the_rest_in_the_gpu_timelines_proportions() -> None:
    run = _train(FakeTimeline(), 40, 30.0)
    rows = StepRows.of_rule(run.record.steps.snapshot(), StepRule("dataloader", (0,)))
    shares = rows.phase_shares()
    truth = np.array([COPY_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS]) / 30.0  # span: 30 ms
    known = ~np.isnan(shares).any(axis=1)
    assert known[-10:].all()  # carried forward between the sampled steps
    assert shares[known] == pytest.approx(np.tile(truth, (known.sum(), 1)))


def test_the_mfu_on_a_gpu_is_over_the_gpu_timelines_step(monkeypatch) -> None:
    """A GPU-bound loop on the simulated timeline, its FLOP count as a T4 in fp16 would give:
    the achieved FLOP/s are the step's FLOPs over its 12 ms on the GPU, the MFU against 65."""
    # an earlier test of the process compiled a model: the count would then be skipped
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    run = _train(FakeTimeline(), 60, 0.5)
    count = run.record.flops
    assert count is not None and count.flops
    flops = 3.9e11  # 65 TFLOP/s for 12 ms: 50% of the T4's fp16 peak in 12 ms steps
    run.record.flops = replace(count, flops=flops, by_dtype={"fp16": flops}, device="Tesla T4")
    summary = analyze(run.record, run.capabilities, warmup=2).summary
    gpu_ms = COPY_MS + FORWARD_MS + BACKWARD_MS + OPTIMIZER_MS
    assert summary.achieved_tflops == pytest.approx(flops / (gpu_ms / 1e3) / 1e12)
    assert summary.mfu == pytest.approx(0.5) and summary.mfu_peak_tflops == 65.0


def test_while_a_cuda_graph_is_captured_the_phases_record_no_event(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    timeline = FakeTimeline()
    run = _train(timeline, 20, 30.0)
    cols = run.record.steps.snapshot()
    assert len(cols.phases) and np.isfinite(cols.phases.values).all()  # the host phases, as ever
    assert np.isnan(cols.gpu_phases.values[:, 1]).all()  # no GPU forward
    assert timeline.records <= 2 * 21  # the fetches' events only


def test_padded_batches_on_a_gpu_make_their_flops_over_their_own_gpu_time(monkeypatch) -> None:
    """Batches padded to their longest sequence, each step's GPU work in proportion to its
    length: taken in proportion to each batch's elements, every step runs at the same FLOP/s,
    and the achieved FLOP/s is that rate, over each step's own span on the GPU timeline (one
    count over the median span read it off by the counted batch's length over the median's)."""
    from traceml_nb.analysis.steps import began_inside, select_rows

    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    timeline = FakeTimeline()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lengths = torch.randint(4, 40, (240,), generator=torch.Generator().manual_seed(0))
    data = [torch.randn(int(n), 4) for n in lengths]

    def pad(items):
        return torch.nn.utils.rnn.pad_sequence(items, batch_first=True)

    ms_per_token = 0.05  # the GPU work each padded position queues
    backends = Backends(event_factory=timeline.event, stream_getter=timeline.current_stream)
    with traceml_nb.Run("padded", sample=False, backends=backends) as run:
        for x in DataLoader(data, batch_size=4, collate_fn=pad):
            timeline.launch(ms_per_token * x.shape[1])
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            timeline.host(0.1)
    count = run.record.flops
    assert count is not None and count.window_ns is not None
    snapshot = run.record.snapshot()
    selection = select_rows(snapshot)
    counted = selection.elements[began_inside(selection, count.window_ns)]
    per_element = 1e6  # FLOPs
    flops = per_element * float(counted.mean())
    run.record.flops = replace(count, flops=flops, by_dtype={"fp16": flops}, device="Tesla T4")
    summary = analyze(run.record, run.capabilities, warmup=2).summary
    assert summary.flop_input_elements is not None
    assert summary.flops_per_step == pytest.approx(per_element * summary.flop_input_elements[1])
    per_second = per_element * 4 * 4 / (ms_per_token / 1e3)  # 16 elements a position
    assert summary.achieved_tflops == pytest.approx(per_second / 1e12, rel=0.02)
