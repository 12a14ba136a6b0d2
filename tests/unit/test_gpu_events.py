"""The CUDA-event stall logic on a simulated GPU timeline (fake events, real tracer)."""

from __future__ import annotations

import math

import pytest
import torch
from fake_cuda import FakeTimeline

from traceml_nb.engine.instrument.gpu_events import GpuStallTimer
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.engine.record import RunRecord


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
    import traceml_nb.engine.instrument.gpu_events as ge
    from traceml_nb import Run

    tl = FakeTimeline()
    made = {}

    def factory(device=None):
        made["events"] = device
        return tl.event

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ge, "cuda_event_factory", factory)
    monkeypatch.setattr(ge, "cuda_stream_getter", lambda device: lambda: None)
    run = Run("cuda", sample=False)
    assert run.device_kind == "cuda" and run.cuda_index == 0
    with run:
        pass
    assert made == {"events": 0}  # the pool of the run's device
    assert run.capabilities.ok("gpu_events")


def test_cpu_run_says_why_gpu_events_are_missing() -> None:
    from traceml_nb import Run

    with Run("cpu", sample=False) as run:
        pass
    assert not run.capabilities.ok("gpu_events")
    assert "CPU" in run.capabilities.why("gpu_events")


# --- the pool and the stream look-up ----------------------------------------------------------
def timeline_of(steps: list[tuple[float, float, float]]) -> tuple[list[float], list[float]]:
    """Expected (stalls, spans), read off the GPU timeline: an event recorded at host time t is
    done at max(t, when the GPU finishes what was queued before it)."""
    now = gpu_done = 0.0
    enter_done, exit_done = [], []
    for wait, gpu, host in steps:
        enter_done.append(max(now, gpu_done))
        now += wait
        exit_done.append(max(now, gpu_done))
        gpu_done = max(gpu_done, now) + gpu
        now += host
    exhausting = max(now, gpu_done)  # the StopIteration fetch's enter event
    nexts = enter_done[1:] + [exhausting]
    stalls = [x - e for e, x in zip(enter_done, exit_done, strict=True)]
    spans = [n - x for x, n in zip(exit_done, nexts, strict=True)]
    return stalls, spans


def varied_steps(n: int, seed: int = 7) -> list[tuple[float, float, float]]:
    """Input-bound, compute-bound and partly hidden steps in a random order; on average the
    GPU keeps up (a GPU that falls further behind every step holds ever more events)."""
    import random

    rng = random.Random(seed)
    return [
        (rng.choice([0.1, 2.0, 9.0]), rng.choice([0.5, 2.0, 6.0]), rng.choice([0.2, 1.0]))
        for _ in range(n)
    ]


def test_pooled_events_give_every_step_its_own_timeline_and_are_reused() -> None:
    """Long enough for the log to be processed during the loop (every CHECK_EVERY fetches):
    events come back to the pool and are recorded again, never before their time was read."""
    from traceml_nb.engine.instrument.tracer import CHECK_EVERY

    steps = varied_steps(6 * CHECK_EVERY)
    tl = FakeTimeline()
    tracer, timer = make(tl)
    drive(tl, tracer, FakeIter(tl, len(steps)), steps)
    assert tl.syncs == 0
    tracer.close()
    stalls, spans = timeline_of(steps)
    table = tracer.record.steps
    assert list(table.gpu_stall_ms) == pytest.approx(stalls, abs=1e-6)
    assert list(table.gpu_span_ms) == pytest.approx(spans, abs=1e-6)
    assert tl.unread_rerecords == 0  # never recorded again before its time was read
    assert tl.records == 2 * len(steps) + 1
    # bounded by the events out between two processings, not by the steps
    assert tl.created <= 2 * CHECK_EVERY + 32  # a GPU a few steps behind holds a few more
    assert tl.created < tl.records / 5
    assert timer.pool.created == tl.created
    assert timer.out == 0 and timer.pending == 0
    assert len(timer.pool.free) == tl.created  # every event is back
    assert len({id(e) for e in timer.pool.free}) == len(timer.pool.free)  # each once
    assert tl.syncs == 1


def test_the_pool_stays_bounded_over_many_epochs() -> None:
    from traceml_nb.engine.instrument.tracer import CHECK_EVERY

    tl = FakeTimeline()
    tracer, timer = make(tl)
    created = []
    for _epoch in range(12):  # a new iterator each epoch; its exhausting fetch's event too
        steps = [(1.0, 1.0, 0.5)] * (CHECK_EVERY // 2)
        drive(tl, tracer, FakeIter(tl, len(steps)), steps)
        created.append(tl.created)
    tracer.close()
    assert created[-1] == created[5]  # warm: no new event from the seventh epoch on
    assert tl.unread_rerecords == 0
    assert tl.syncs == 1
    assert timer.resolved == 12 * (CHECK_EVERY // 2)


def test_a_shared_pool_serves_the_next_run_without_new_events() -> None:
    from traceml_nb.engine.instrument.gpu_events import EventPool

    tl = FakeTimeline()
    pool = EventPool(tl.event)
    for run in range(3):
        rec = RunRecord()
        timer = GpuStallTimer(rec.steps, pool)
        tracer = StepTracer(rec, clock=tl.clock, gpu=timer)
        steps = [(2.0, 1.0, 0.5)] * 100
        drive(tl, tracer, FakeIter(tl, len(steps)), steps)
        tracer.close()
        assert list(rec.steps.gpu_stall_ms) == pytest.approx(timeline_of(steps)[0], abs=1e-6)
        # every event back once the run ended, none twice (a step's own two go back with it)
        assert len(pool.free) == pool.created == len({id(ev) for ev in pool.free})
        if run == 0:
            first = pool.created
    assert pool.created == first  # runs 2 and 3 took every event from the pool
    assert tl.unread_rerecords == 0


def test_events_of_a_truncated_step_go_back_after_the_end() -> None:
    tl = FakeTimeline()
    tracer, timer = make(tl)
    it = FakeIter(tl, 10)
    for _ in range(5):  # the loop breaks out: its last step is closed by the run's end
        tracer.wrap_next(it.next_fn)(it)
        tl.launch(1.0)
        tl.host(1.0)
    tracer.close()
    assert timer.resolved == 4
    assert len(timer.pool.free) == tl.created == 10  # the truncated step's two as well
    assert timer.out == 0


def test_a_far_behind_gpu_costs_one_query_per_processing() -> None:
    from traceml_nb.engine.instrument.tracer import CHECK_EVERY

    tl = FakeTimeline()
    tracer, timer = make(tl)
    n = 4 * CHECK_EVERY
    it = FakeIter(tl, n)
    for _ in range(n):
        it.wait_ms = 0.1
        tracer.wrap_next(it.next_fn)(it)
        tl.launch(1000.0)  # a queue that never drains while the loop runs
        tl.host(0.1)
    assert timer.resolved == 0
    assert tl.queries <= 4  # one "not yet" per processing, not one per step
    tracer.close()
    assert tl.syncs == 1 and timer.resolved == n - 1


def test_the_stream_is_looked_up_once_per_iterator() -> None:
    tl = FakeTimeline()
    rec = RunRecord()
    timer = GpuStallTimer(rec.steps, tl.event, tl.current_stream)
    tracer = StepTracer(rec, clock=tl.clock, gpu=timer)
    for _epoch in range(3):
        drive(tl, tracer, FakeIter(tl, 10), [(1.0, 1.0, 1.0)] * 10)
    tracer.close()
    assert tl.stream_lookups == 3 == timer.stream_lookups
    assert tl.syncs == 1


def test_a_new_stream_is_seen_at_the_next_iterator_and_within_the_check_period() -> None:
    from traceml_nb.engine.instrument.gpu_events import STREAM_CHECK_EVERY

    tl = FakeTimeline()
    rec = RunRecord()
    recorded: list[object] = []

    class Recorded(type(tl.event())):  # the fake event, noting each record's stream
        def record(self, stream=None):
            recorded.append(stream)
            super().record(stream)

    timer = GpuStallTimer(rec.steps, lambda: Recorded(tl), tl.current_stream)
    tracer = StepTracer(rec, clock=tl.clock, gpu=timer)
    drive(tl, tracer, FakeIter(tl, 5), [(1.0, 1.0, 1.0)] * 5)
    tl.stream = "stream 1"  # e.g. `with torch.cuda.stream(s):` around the next epoch
    drive(tl, tracer, FakeIter(tl, 5), [(1.0, 1.0, 1.0)] * 5)
    assert recorded[:11] == ["stream 0"] * 11  # 5 fetches and the exhausting one
    assert recorded[11:] == ["stream 1"] * 11
    assert tl.stream_lookups == 2

    # a change in the middle of an epoch is seen at the next check
    n = 3 * STREAM_CHECK_EVERY
    it = FakeIter(tl, n)
    wrapped = tracer.wrap_next(it.next_fn)
    recorded.clear()
    for i in range(n):
        if i == STREAM_CHECK_EVERY + 5:
            tl.stream = "stream 2"
        wrapped(it)
        tl.launch(0.5)
        tl.host(0.5)
    switch = 2 * (2 * STREAM_CHECK_EVERY)  # two marks a fetch
    assert set(recorded[:switch]) == {"stream 1"}
    assert set(recorded[switch:]) == {"stream 2"}
    assert tl.stream_lookups == 2 + 3  # at fetch 0, 64 and 128 of this iterator
    tracer.close()
    assert tl.syncs == 1


def test_no_synchronisation_and_bounded_queries_with_a_reader() -> None:
    """With a reader processing the log every few steps (the live view), nothing synchronises
    and each processing queries at most one step it cannot resolve."""
    tl = FakeTimeline()
    tracer, timer = make(tl)
    tracer.attach_reader()
    it = FakeIter(tl, 400)
    wrapped = tracer.wrap_next(it.next_fn)
    for i in range(400):
        it.wait_ms = 1.0
        wrapped(it)
        tl.launch(1.0)
        tl.host(0.5)
        if i % 10 == 9:
            tracer.read(lambda: None)
    assert tl.syncs == 0
    assert tl.queries <= timer.resolved + 40
    assert tl.created <= 2 * (10 + 8)  # events out between two reads
    tracer.attach_reader(False)
    tracer.close()
    assert tl.unread_rerecords == 0 and tl.syncs == 1


def test_cpu_run_has_no_gpu_timer() -> None:
    from traceml_nb import Run

    with Run("cpu", sample=False, device="cpu") as run:
        pass
    assert run.tracer is None or run.tracer.gpu is None


def test_a_failing_query_or_record_costs_that_step_only() -> None:
    tl = FakeTimeline()
    calls = {"query": 0, "record": 0}

    class Flaky(type(tl.event())):
        def query(self):
            calls["query"] += 1
            if calls["query"] == 3:
                raise RuntimeError("CUDA error: unspecified launch failure")
            return super().query()

        def record(self, stream=None):
            calls["record"] += 1
            if calls["record"] == 7:
                raise RuntimeError("CUDA error: out of memory")
            super().record(stream)

    rec = RunRecord()
    timer = GpuStallTimer(rec.steps, lambda: Flaky(tl), lag=0)
    tracer = StepTracer(rec, clock=tl.clock, gpu=timer)
    drive(tl, tracer, FakeIter(tl, 20), [(1.0, 0.5, 1.0)] * 20)
    tracer.process()
    tracer.close()
    stall = list(rec.steps.gpu_stall_ms)
    assert len(stall) == 20 and timer.errors == 2
    assert sum(math.isnan(v) for v in stall) == 3  # the query's step, and the record's two
    assert tracer.error is None  # the tracing went on


def test_the_pool_keeps_at_most_max_free_events() -> None:
    from traceml_nb.engine.instrument.gpu_events import EventPool

    tl = FakeTimeline()
    pool = EventPool(tl.event, max_free=3)
    events = [pool.new() for _ in range(5)]
    for ev in events:
        pool.put(ev)
    assert pool.created == 5 and pool.free == events[:3]


def test_cuda_pools_are_shared_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import traceml_nb.engine.instrument.gpu_events as ge

    monkeypatch.setattr(ge, "_cuda_pools", {})
    assert ge.cuda_event_factory(0) is ge.cuda_event_factory(0)
    assert ge.cuda_event_factory(1) is not ge.cuda_event_factory(0)  # an event has one device
    assert ge.cuda_event_factory(0).created == 0  # none made until a fetch needs one
