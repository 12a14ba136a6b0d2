"""The ``hostcost`` check: the host time the tracer adds to a step of a host-bound GPU loop,
CUDA events included, from interleaved blocks; and whether its CUDA events are pooled.

A tiny MLP on the GPU (the host launches faster than nothing: the GPU keeps up, so every
host microsecond is a microsecond of the step), a real ``DataLoader`` over indices
(``num_workers=0``). One loop runs ``HOST_COST_PAIRS`` pairs of ``HOST_COST_BLOCK_STEPS``-step
blocks, plain and traced in ABBA order (a linear drift cancels), inside one ``Run`` on the GPU
without samplers: its hooks are installed for the traced blocks only, so the tracer and its
event pool live as in a long run; the iterator carries on across blocks; the first two steps
of a block are not counted (installing the hooks invalidates type caches).

**Added per step** = the median time inside ``next()`` and ``optimizer.step()`` (where our
code runs on every step) of the traced blocks minus that of the plain ones, with a 95%
bootstrap interval over the pairs (:func:`~.stats.median_difference`), **plus** the processing
the loop's thread did (segmenting the log, resolving the CUDA events:
``StepTracer.processing_ns``) per traced step. It must be at most ``HOST_COST_BUDGET_US``. The
whole step's added time is reported beside it: it also holds the phases' hooks in the forward
and backward, in place on one sampled step in many (one in about every 0.05 s of training for
the first 32, every 0.2 s and 32 steps at least after: a sample is ~100 us on the host), and
the compute's own noise.

A warm-up run of the same blocks first fills the device's shared event pool; the measured run
must then create next to no event (``EventPool.created``: at most one per
``NEW_EVENTS_PER_FETCHES`` traced fetches, for a peak of events in flight the warm-up did not
reach) and look the stream up about once per
:data:`~traceml_nb.engine.instrument.gpu_events.STREAM_CHECK_EVERY` fetches. The verdict
(:func:`judge_host_cost`) is a pure function, tested without a GPU.

Beside it, the stall timer's CUDA calls a step, each timed alone (:func:`stall_timer_calls_us`):
the driver's share of the added time, which no change to our Python takes away (fewer calls a
step would).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from .cuda import cuda_call_costs_us, torch_module
from .paired_stats import median_difference
from .results import FAIL, PASS, Budget, CheckResult

#: Host time the tracer may add to a step of a host-bound GPU loop, us, with the step's phases
#: timed as in any run (sampled, their CUDA events included): the anatomy's budget (10 us), which
#: took the place of the 5 us of the GPU path before the phases.
HOST_COST_BUDGET_US = 10.0
HOST_COST_PAIRS = 300
HOST_COST_BLOCK_STEPS = 8
#: With a warm pool, a run may create at most one event per this many traced fetches.
NEW_EVENTS_PER_FETCHES = 100
#: The CUDA calls the stall timer makes a step: a pooled event recorded at the fetch's entry
#: and exit, one query (is the step's next fetch done on the GPU?) and two elapsed times (the
#: stall and the span).
STALL_TIMER_CALLS = {"record_reused_event": 2, "query": 1, "elapsed_time": 2}


def judge_host_cost(
    added_us: float, new_events: int, lookups: int, fetches: int, check_every: int
) -> list[str]:
    """What is wrong (empty: it passes): more than ``HOST_COST_BUDGET_US`` added per step, more
    than one event created per ``NEW_EVENTS_PER_FETCHES`` fetches although the pool was warm,
    or more stream look-ups than one per ``check_every`` fetches (and one per iterator, of which
    the loop makes a handful)."""
    problems = []
    if added_us > HOST_COST_BUDGET_US:
        problems.append(f"adds {added_us:.2f} us a step (budget {HOST_COST_BUDGET_US:.0f} us)")
    if new_events > fetches // NEW_EVENTS_PER_FETCHES:
        problems.append(f"{new_events} CUDA events created for {fetches} fetches with a warm pool")
    allowed = fetches // check_every + 8
    if lookups > allowed:
        problems.append(f"{lookups} stream look-ups for {fetches} fetches (at most {allowed})")
    return problems


class _Loop:
    """A host-bound training step on the GPU and a loader that never ends."""

    def __init__(self, torch: Any) -> None:
        from torch.utils.data import DataLoader, TensorDataset

        device = torch.device("cuda", torch.cuda.current_device())
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        ).to(device)
        self.x = torch.randn(64, 32, device=device)
        self.y = torch.randint(0, 10, (64,), device=device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()
        self.loader = DataLoader(TensorDataset(torch.arange(64 * 4096)), batch_size=64)
        self.it = iter(self.loader)
        self.iterators = 1

    def next(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            self.iterators += 1
            return next(self.it)

    def compute(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(self.x), self.y).backward()


def stall_timer_calls_us(costs: dict[str, float]) -> float:
    """The host time of the stall timer's CUDA calls for one step, us, from each call's
    (:func:`~.cuda.cuda_call_costs_us`): ``STALL_TIMER_CALLS`` of each, our Python left out."""
    return sum(costs[call] * times for call, times in STALL_TIMER_CALLS.items())


#: Per-block lists of times, ns, by whether the block was traced.
Blocks = dict[bool, list[list[float]]]


def _blocks(loop: _Loop, tracer: Any, pairs: int, block_steps: int) -> tuple[Blocks, Blocks]:
    """Per-block lists of the time inside ``next()`` and ``optimizer.step()``, and of the
    whole step, ns, by traced: ``(inside, whole)``."""
    from ..engine.instrument import hooks

    clock = time.perf_counter_ns
    inside: Blocks = {False: [], True: []}
    whole: Blocks = {False: [], True: []}
    hooks.uninstall(pause=True)  # the first block is plain
    for block in range(2 * pairs):
        traced = block % 4 in (1, 2)
        if traced:
            hooks.install(tracer)
            tracer.active = True  # uninstall() had made its wrapper call through
        times: list[float] = []
        steps: list[float] = []
        try:
            for i in range(-2, block_steps):
                t0 = clock()
                loop.next()
                t1 = clock()
                loop.compute()
                t2 = clock()
                loop.opt.step()
                t3 = clock()
                if i >= 0:
                    times.append((t1 - t0) + (t3 - t2))
                    steps.append(t3 - t0)
        finally:
            if traced:
                hooks.uninstall(pause=True)
        inside[traced].append(times)
        whole[traced].append(steps)
    return inside, whole


def check_host_cost(budget: Budget) -> CheckResult:
    torch = torch_module()
    from ..engine.instrument.gpu_events import STREAM_CHECK_EVERY, cuda_event_factory
    from ..engine.run import Run

    loop = _Loop(torch)
    index = torch.cuda.current_device()
    with Run("selfcheck-hostcost-warmup", device=index, sample=False) as warmup:
        _blocks(loop, warmup.tracer, HOST_COST_PAIRS, HOST_COST_BLOCK_STEPS)  # fills the pool
    torch.cuda.synchronize()
    pool = cuda_event_factory(index)
    created_before, iterators_before = pool.created, loop.iterators
    run = Run("selfcheck-hostcost", device=index, sample=False)
    gc.collect()
    gc.disable()
    run.start()
    try:
        tracer = run.tracer
        assert tracer is not None, "a started run has its tracer"
        timer = tracer.gpu
        if timer is not None:
            inside, whole = _blocks(loop, tracer, HOST_COST_PAIRS, HOST_COST_BLOCK_STEPS)
            processing_ns = tracer.processing_ns
    finally:
        run.stop()
        gc.enable()
    if timer is None:
        why = run.capabilities.why("gpu_events")
        return CheckResult("hostcost", FAIL, f"the run has no CUDA event timing: {why}", {})
    torch.cuda.synchronize()
    calls_alone = cuda_call_costs_us(torch)
    stall_calls_us = stall_timer_calls_us(calls_alone)
    traced_steps = HOST_COST_PAIRS * (HOST_COST_BLOCK_STEPS + 2)
    calls = median_difference(inside[False], inside[True])
    step = median_difference(whole[False], whole[True])
    calls_us = calls.median / 1e3
    processing_us = processing_ns / traced_steps / 1e3
    added_us = calls_us + processing_us
    new_events = pool.created - created_before
    fetches = traced_steps
    problems = judge_host_cost(
        added_us, new_events, timer.stream_lookups, fetches, STREAM_CHECK_EVERY
    )
    plain_us = statistics.median(x for block in inside[False] for x in block) / 1e3
    details = {
        "added_us": added_us,
        "calls_us": [calls_us, calls.low / 1e3, calls.high / 1e3],
        "whole_step_us": [step.median / 1e3, step.low / 1e3, step.high / 1e3],
        "processing_us": processing_us,
        "plain_calls_us": plain_us,
        "pairs": HOST_COST_PAIRS,
        "block_steps": HOST_COST_BLOCK_STEPS,
        "events_created_warm": new_events,
        "pool_free": len(pool.free),
        "stream_lookups": timer.stream_lookups,
        "iterators": loop.iterators - iterators_before + 1,
        "fetches": fetches,
        "queries": timer.queries,
        "resolved": timer.resolved,
        "errors": timer.errors,
        "cuda_call_us": calls_alone,
        "stall_timer_calls_us": stall_calls_us,
        "budget_us": HOST_COST_BUDGET_US,
        "problems": problems,
    }
    summary = (
        f"tiny MLP on the GPU: +{added_us:.2f} us a step (inside the calls {calls_us:+.2f} "
        f"[{calls.low / 1e3:+.2f}, {calls.high / 1e3:+.2f}] + processing {processing_us:.2f}; "
        f"plain {plain_us:.1f} us inside the calls; the whole step {step.median / 1e3:+.2f} "
        f"[{step.low / 1e3:+.2f}, {step.high / 1e3:+.2f}]); warm pool: {new_events} new events, "
        f"{timer.stream_lookups} stream look-ups for {fetches} fetches, {timer.queries} "
        f"queries for {timer.resolved} resolved steps; the stall timer's CUDA calls alone "
        f"{stall_calls_us:.2f} us a step (2 records of {calls_alone['record_reused_event']:.2f}, a "
        f"query of {calls_alone['query']:.2f}, 2 elapsed times of "
        f"{calls_alone['elapsed_time']:.2f})"
    )
    print("  " + summary, flush=True)
    if problems:
        return CheckResult("hostcost", FAIL, "; ".join([summary, *problems]), details)
    return CheckResult("hostcost", PASS, summary, details)
