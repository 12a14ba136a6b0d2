"""The CUDA-event stall logic on a simulated GPU timeline (fake events, real tracer)."""

from __future__ import annotations

import math

import pytest
import torch
from fake_cuda import FakeTimeline

from traceml_nb.instrument.gpu_events import GpuStallTimer
from traceml_nb.instrument.tracer import StepTracer
from traceml_nb.record import RunRecord


class FakeIter:
    """Stands in for a DataLoader iterator; each fetch costs ``wait_ms`` of host time."""

    def __init__(self, timeline: FakeTimeline, n: int) -> None:
        self._index_sampler = object()
        self._num_yielded = 0
        self._tl = timeline
        self._left = n
        self.wait_ms = 0.0

    def next_fn(self, it: FakeIter) -> torch.Tensor:
        if self._left == 0:
            raise StopIteration
        self._left -= 1
        self._num_yielded += 1
        self._tl.host(self.wait_ms)
        return torch.zeros(4, 2)


def make(timeline: FakeTimeline, lag: int = 2) -> tuple[StepTracer, GpuStallTimer]:
    rec = RunRecord()
    timer = GpuStallTimer(rec.steps, timeline.event, lag=lag)
    return StepTracer(rec, clock=timeline.clock, gpu=timer), timer


def drive(
    timeline: FakeTimeline,
    tracer: StepTracer,
    it: FakeIter,
    steps: list[tuple[float, float, float]],
) -> None:
    """Each step: (data wait ms, GPU work ms, host work ms after launching)."""
    for wait, gpu, host in steps:
        it.wait_ms = wait
        tracer.wrap_next(it.next_fn)(it)
        timeline.launch(gpu)
        timeline.host(host)
    with pytest.raises(StopIteration):
        tracer.wrap_next(it.next_fn)(it)


def expected_stalls(steps: list[tuple[float, float, float]]) -> list[float]:
    """stall = max(0, data arrival - GPU done with the previous step), computed independently."""
    now = gpu_done = 0.0
    out = []
    for wait, gpu, host in steps:
        enter = now
        arrival = enter + wait
        out.append(max(0.0, arrival - max(enter, gpu_done)))
        now = arrival
        gpu_done = max(gpu_done, now) + gpu
        now += host
    return out


CASES = {
    "input-bound: GPU idle while waiting": [(10.0, 2.0, 0.5)] * 8,
    "compute-bound: GPU busy through the wait": [(1.0, 20.0, 0.5)] * 8,
    "partly hidden": [(6.0, 4.0, 0.5)] * 8,
    "mixed": [
        (5.0, 1.0, 0.2),
        (0.5, 30.0, 0.1),
        (12.0, 3.0, 0.2),
        (0.1, 0.1, 0.1),
        (8.0, 8.0, 8.0),
    ],
}


@pytest.mark.parametrize("name", list(CASES))
def test_stall_matches_the_timeline(name: str) -> None:
    steps = CASES[name]
    tl = FakeTimeline()
    tracer, timer = make(tl)
    it = FakeIter(tl, len(steps))
    drive(tl, tracer, it, steps)
    tracer.close()
    table = tracer.record.steps
    assert len(table) == len(steps)
    got = list(table.gpu_stall_ms)
    for g, e in zip(got, expected_stalls(steps), strict=False):
        assert g == pytest.approx(e, abs=1e-3)
    assert all(not math.isnan(v) for v in table.gpu_span_ms)


def test_gpu_span_is_time_from_arrival_to_next_fetch_on_the_gpu() -> None:
    steps = [(2.0, 5.0, 1.0)] * 4  # GPU-bound after the first stall
    tl = FakeTimeline()
    tracer, _ = make(tl)
    drive(tl, tracer, FakeIter(tl, 4), steps)
    tracer.close()
    spans = list(tracer.record.steps.gpu_span_ms)
    # the GPU is busy 5 ms per step and the host needs 3 ms: the GPU timeline is 5 ms a step
    assert spans[1:3] == pytest.approx([5.0, 5.0], abs=1e-3)


def test_no_synchronisation_per_step_and_one_at_the_end() -> None:
    steps = [(1.0, 3.0, 0.5)] * 200
    tl = FakeTimeline()
    tracer, timer = make(tl)
    drive(tl, tracer, FakeIter(tl, len(steps)), steps)
    assert tl.syncs == 0, "a per-step synchronize() happened"
    assert tl.queries <= 2 * len(steps)  # polling is bounded: ~one query per step
    tracer.close()
    assert tl.syncs == 1
    assert timer.pending == 0
    assert timer.resolved == len(steps)


def test_events_resolve_lazily_a_few_steps_behind() -> None:
    tl = FakeTimeline()
    tracer, timer = make(tl, lag=2)
    it = FakeIter(tl, 50)
    for _ in range(20):
        it.wait_ms = 1.0
        tracer.wrap_next(it.next_fn)(it)
        tl.launch(0.5)
        tl.host(2.0)  # host slower than the GPU: events complete quickly
    tracer.process()  # what an event does once PROCESS_EVERY_NS have passed
    assert timer.pending <= 3
    assert timer.resolved >= 16
    tracer.close()


def test_gpu_far_behind_keeps_rows_pending_until_the_end() -> None:
    tl = FakeTimeline()
    tracer, timer = make(tl)
    it = FakeIter(tl, 30)
    for _ in range(30):
        it.wait_ms = 0.1
        tracer.wrap_next(it.next_fn)(it)
        tl.launch(100.0)  # a queue that never drains while the loop runs
        tl.host(0.1)
    tracer.process()
    assert timer.resolved == 0
    assert math.isnan(tracer.record.steps.gpu_stall_ms[0])
    tracer.close()
    assert timer.resolved == 29  # the last (truncated) step has no next fetch: unavailable
    assert math.isnan(tracer.record.steps.gpu_stall_ms[29])


def test_a_failing_event_leaves_the_value_unavailable() -> None:
    class BrokenEvent:
        def record(self, stream=None):
            pass

        def query(self):
            return True

        def elapsed_time(self, other):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def synchronize(self):
            pass

    rec = RunRecord()
    timer = GpuStallTimer(rec.steps, BrokenEvent, lag=0)
    tl = FakeTimeline()
    tracer = StepTracer(rec, clock=tl.clock, gpu=timer)
    it = FakeIter(tl, 3)
    drive(tl, tracer, it, [(1.0, 1.0, 1.0)] * 3)
    tracer.close()
    assert timer.errors == 3
    assert all(math.isnan(v) for v in rec.steps.gpu_stall_ms)


def test_real_cuda_path_is_chosen_automatically(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA available, Run builds a GpuStallTimer over torch.cuda.Event on the current stream."""
    import traceml_nb.instrument.gpu_events as ge
    from traceml_nb import Run

    tl = FakeTimeline()
    made = {}

    def factory():
        made["events"] = True
        return tl.event

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ge, "cuda_event_factory", factory)
    monkeypatch.setattr(ge, "cuda_stream_getter", lambda device: lambda: None)
    run = Run("cuda", sample=False)
    assert run.device_kind == "cuda" and run.cuda_index == 0
    with run:
        pass
    assert made == {"events": True}
    assert run.capabilities.ok("gpu_events")


def test_cpu_run_says_why_gpu_events_are_missing() -> None:
    from traceml_nb import Run

    with Run("cpu", sample=False) as run:
        pass
    assert not run.capabilities.ok("gpu_events")
    assert "CPU" in run.capabilities.why("gpu_events")
