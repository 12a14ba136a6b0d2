"""How the cost of a whole loop is measured: one function a method, figures out (the table is
``report.py``'s; the hot path on its own is ``hot_path.py``'s).

* :func:`repetitions`: every variant (``VARIANTS``) runs the whole loop once a repetition, in
  an order that rotates; also what a run costs to start and stop, and its threads' CPU.
* :func:`interleaved_cost`: one loop whose blocks of steps alternate between plain and traced
  (the run's hooks installed), the full monitor running throughout: the per-step figure the
  budget is judged on.
* :func:`profiler_interleaved_cost`: the same blocks, plain against ``torch.profiler``.
* :func:`sampler_idle_cost`, :func:`monitor_steady_cost`, :func:`import_time`: the samplers'
  and the live view's CPU, and ``import traceml_nb``; memory is ``memory.py``'s.

Every paired statistic comes from :mod:`traceml_nb.selfcheck.paired_stats`; times are measured in ns
and reported in us.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads import Workload, run_loop

import traceml_nb
from traceml_nb.engine.instrument import hooks
from traceml_nb.engine.instrument.step_phases import EARLY_SAMPLES
from traceml_nb.selfcheck.paired_stats import Estimate, bootstrap_interval, median_difference

REPO = Path(__file__).resolve().parent.parent
#: The interleaved blocks' traced start lasts at most this long, s (:func:`interleaved_cost`).
SETTLE_MAX_S = 30.0
#: Packages that ``import traceml_nb`` must not pull in (they are imported when used).
HEAVY_MODULES = ("torch", "IPython", "bokeh", "pynvml", "psutil", "numpy", "pandas", "ipywidgets")
NAN_ESTIMATE = Estimate(math.nan, math.nan, math.nan)


def in_us(estimate: Estimate) -> Estimate:
    """An estimate in ns, in us."""
    return Estimate(*(value / 1e3 for value in estimate))


def live_view_class() -> tuple[Any, str]:
    """``(LiveView, '')`` or ``(None, why it is not available)``."""
    try:
        from traceml_nb.views.live.view import LiveView
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return LiveView, ""


@contextmanager
def monitored_run(
    name: str, view_class: tuple[Any, str]
) -> Iterator[tuple[traceml_nb.Run, Any, str]]:
    """A started run with its samplers on (10 Hz) and the live view's writer running headless
    (``view_class`` as :func:`live_view_class` returns it): ``(run, view, '')``, or
    ``(run, None, why the view is not available)``. At the end the view is closed, then the
    run stopped."""
    live_view, why = view_class
    run = traceml_nb.Run(name, sample=True, interval=0.1, device="cpu")
    run.start()
    view = None
    try:
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
        yield run, view, why
    finally:
        try:
            if view is not None:
                view.close()
        finally:
            run.stop()


# --- alternating repetitions of the whole loop -------------------------------------------------
@dataclass
class Timing:
    """One variant's repetition: loop time, fixed start/stop cost and thread CPU, all ns."""

    loop_ns: int
    median_step_ns: float  #: median of the single steps' durations (robust to noise bursts)
    setup_ns: int = 0
    teardown_ns: int = 0
    sampler_busy_ns: int | None = None
    view_cpu_ns: int | None = None
    run_ns: int | None = None
    notes: list[str] = field(default_factory=list)
    processing_ns: int | None = None  #: the loop's thread segmenting the log, during the loop


def _timed_loop(work: Workload) -> tuple[int, float]:
    """``(loop ns, median step ns)`` of one run of the loop, garbage collector off."""
    stamps: list[int] = []
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        run_loop(work, stamps)
        loop = time.perf_counter_ns() - t0
    finally:
        gc.enable()
    steps = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
    return loop, statistics.median(steps)


def time_plain(work: Workload) -> Timing:
    return Timing(*_timed_loop(work))


def time_tracer(work: Workload) -> Timing:
    """``traceml_nb.Run(sample=False)``: the hooks alone; the loop's thread segments the log."""
    t0 = time.perf_counter_ns()
    run = traceml_nb.Run("bench-tracer", sample=False, device="cpu")
    run.start()
    setup = time.perf_counter_ns() - t0
    try:
        loop = _timed_loop(work)
        processing = run.tracer.processing_ns
    finally:
        t1 = time.perf_counter_ns()
        run.stop()
        teardown = time.perf_counter_ns() - t1
    return Timing(*loop, setup, teardown, run_ns=run.record.elapsed_ns, processing_ns=processing)


def time_monitor(work: Workload) -> Timing:
    """The full monitor: samplers on (10 Hz) and the live view's writer running headless."""
    view_class = live_view_class()  # imported before the clock starts
    notes: list[str] = []
    t0 = time.perf_counter_ns()
    with monitored_run("bench-monitor", view_class) as (run, view, why):
        if view is None:
            notes.append(f"view: not available ({why})")
        setup = time.perf_counter_ns() - t0
        loop = _timed_loop(work)
        processing = run.tracer.processing_ns
        t1 = time.perf_counter_ns()
    teardown = time.perf_counter_ns() - t1
    busy = int(run.sampler_busy_s * 1e9) if run.capabilities.ok("host") else None
    view_cpu = None
    if view is not None:
        view_cpu = int(view.busy_s * 1e9)
        if view.error:
            notes.append(f"view error: {view.error}")
    notes.extend(note for note in run.capabilities.notes if note not in notes)
    return Timing(*loop, setup, teardown, busy, view_cpu, run.record.elapsed_ns, notes, processing)


def time_profiler(work: Workload) -> Timing:
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter_ns()
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.__enter__()
    setup = time.perf_counter_ns() - t0
    try:
        loop = _timed_loop(work)
    finally:
        t1 = time.perf_counter_ns()
        prof.__exit__(None, None, None)
        teardown = time.perf_counter_ns() - t1
    del prof
    gc.collect()
    return Timing(*loop, setup, teardown)


VARIANTS: dict[str, Callable[[Workload], Timing]] = {
    "plain": time_plain,
    "tracer": time_tracer,
    "monitor": time_monitor,
    "profiler": time_profiler,
}


def rotated(names: list[str], rep: int) -> list[str]:
    """The variant order of repetition ``rep``: the list rotated by ``rep`` places."""
    k = rep % len(names)
    return names[k:] + names[:k]


def freeze_heap() -> None:
    """Move every object alive now (torch, bokeh, the models) to the collector's permanent
    generation: the collection before each timed loop then visits only what the repetitions
    created, ~1 ms instead of the ~0.3 s a full collection takes here with torch imported."""
    gc.collect()
    gc.freeze()


def repetitions(work: Workload, reps: int, log: Callable[[str], None]) -> dict[str, list[Timing]]:
    """``reps`` alternating repetitions of every variant, after one untimed warm-up round."""
    names = list(VARIANTS)
    for name in names:
        VARIANTS[name](work)
    freeze_heap()  # what the warm-up imported (bokeh for the view, the profiler) too
    results: dict[str, list[Timing]] = {name: [] for name in names}
    for rep in range(reps):
        for name in rotated(names, rep):
            results[name].append(VARIANTS[name](work))
        plain = results["plain"][-1].loop_ns / work.steps / 1e3
        log(f"  {work.name}: repetition {rep + 1}/{reps}, plain {plain:.1f} us/step")
    return results


# --- interleaved blocks: the per-step cost with the drift cancelled ----------------------------
@dataclass
class Interleaved:
    """What the run's hooks add per step, from one loop whose ``block_steps``-step blocks
    alternate between plain and traced (pair ``i``: blocks ``2i`` and ``2i + 1``, one plain and
    one traced). ``step``: the whole step (``next()`` to the end of ``optimizer.step()``);
    ``calls``: only the time inside ``next()`` and ``optimizer.step()``, where our code runs;
    both median traced step - median plain step, us, with a 95% bootstrap interval over the
    pairs (``stats.median_difference``). ``own_next``: our own time inside ``next()``, step by
    step (time in ``next()`` minus the data wait the run logged for that fetch), its median
    and a bootstrap interval over the pairs; NaN when the wrapper logs no fetch (breakdown).
    ``loop_processing_us`` / ``reader_processing_us``: segmenting the log into rows, per
    traced step, on the loop's thread and on the live view's thread. ``settle_steps`` /
    ``settle_samples``: the traced start before the blocks, in steps, and the phase samples the
    run had taken by its end (0 / 0: none)."""

    pairs: int
    block_steps: int
    monitor: str  #: what ran besides the hooks: the samplers and live view, or nothing
    plain_step_us: float
    plain_calls_us: float
    step_us: float
    step_lo: float
    step_hi: float
    calls_us: float
    calls_lo: float
    calls_hi: float
    own_next_us: float
    own_next_lo: float
    own_next_hi: float
    loop_processing_us: float
    reader_processing_us: float
    settle_steps: int = 0
    settle_samples: int = 0


def _phase_samples() -> int:
    """The phase samples the installed run has taken (its instruments are the hooks' own)."""
    installed = hooks._installed
    return installed.phases.schedule.samples if installed is not None else 0


def pooled_median(blocks: Sequence[Sequence[float]]) -> float:
    """The median of every value of every block (NaN when there is none)."""
    values = [x for block in blocks for x in block]
    return statistics.median(values) if values else math.nan


def _median_with_interval(blocks: list[list[float]], resamples: int) -> Estimate:
    """The median of every value in ``blocks`` (one block a pair), with a bootstrap interval
    that resamples the pairs."""
    if not any(blocks):
        return NAN_ESTIMATE

    def median_of(picks: list[int]) -> float:
        return pooled_median([blocks[i] for i in picks])

    low, high = bootstrap_interval(median_of, len(blocks), resamples=resamples)
    return Estimate(pooled_median(blocks), low, high)


def interleaved_cost(
    work: Workload,
    pairs: int,
    block_steps: int = 8,
    monitor: bool = True,
    resamples: int = 2000,
    settle: bool = True,
) -> Interleaved:
    """``pairs`` pairs of blocks in the order plain-traced, traced-plain, ... (ABBA: a linear
    drift cancels); the loader's iterator carries on across blocks. One run lasts the whole
    loop, with ``monitor`` its samplers (10 Hz) and the headless live view too, running
    through the plain blocks as well; ``hooks.install`` with the run's tracer before each
    traced block, ``hooks.uninstall(pause=True)`` after it, so the tracer lives as in a long
    run (its phase instruments resume where their sampling stood, the model found once): its log
    grows over the traced blocks and the live view's thread segments it at each tick (without
    a view the loop does, every ``PROCESS_EVENTS`` events: left in the medians, timed apart as
    ``StepTracer.processing_ns``). The first two steps of every block (plain too) are not
    counted: installing or removing the hooks invalidates type caches. The garbage collector
    is off throughout.

    With ``settle``, the traced loop first runs alone until the run has taken its first
    ``EARLY_SAMPLES`` phase samples (:mod:`traceml_nb.engine.instrument.step_phases`: one every
    0.05 s of training at a run's start, a one-off of ~70 us each; on the bare loop 0.3-0.5 us
    a step of 4,000 traced steps, all inside that start), at most ``SETTLE_MAX_S``: the blocks
    then time a long run's steady sampling. Its pace still counts the plain blocks' time, so
    they sample about twice as often a traced step as a long run does."""
    clock = time.perf_counter_ns
    optimizer_step = work.optimizer.step
    it = iter(work.loader)
    whole: dict[bool, list[list[float]]] = {False: [], True: []}
    calls: dict[bool, list[list[float]]] = {False: [], True: []}
    fetch_ns: list[int] = []  # each traced step's time in next(), in order: a step row each
    counted: list[tuple[int, int]] = []  # (index in fetch_ns, pair) of one-fetch counted steps
    live_view, why = live_view_class() if monitor else (None, "")
    run = traceml_nb.Run("bench-interleaved", sample=monitor, interval=0.1, device="cpu")
    view = None
    gc.collect()
    gc.disable()
    run.start()
    tracer = run.tracer
    try:
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
        settle_steps, deadline = 0, clock() + int(SETTLE_MAX_S * 1e9)
        while settle and _phase_samples() < EARLY_SAMPLES and clock() < deadline:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                it = iter(work.loader)
                batch = next(it)
            fetch_ns.append(clock() - t0)
            work.train_step(batch)
            settle_steps += 1
        settle_samples = _phase_samples() if settle else 0
        hooks.uninstall(pause=True)  # the first block is plain
        for block in range(2 * pairs):
            traced = block % 4 in (1, 2)
            if traced:
                hooks.install(tracer)
                tracer.active = True  # uninstall() had made its wrapper call through
            steps: list[float] = []
            inside: list[float] = []
            try:
                for i in range(-2, block_steps):
                    single = True
                    t0 = clock()
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(work.loader)
                        batch = next(it)
                        single = False  # two fetches: no own time for this step
                    t1 = clock()
                    work.compute(batch)
                    t2 = clock()
                    optimizer_step()
                    t3 = clock()
                    if traced:
                        fetch_ns.append(t1 - t0)
                    if i >= 0:
                        steps.append(t3 - t0)
                        inside.append((t1 - t0) + (t3 - t2))
                        if traced and single:
                            counted.append((len(fetch_ns) - 1, block // 2))
            finally:
                if traced:
                    hooks.uninstall(pause=True)
            whole[traced].append(steps)
            calls[traced].append(inside)
        loop_ns, reader_ns = tracer.processing_ns, tracer.reader_processing_ns
    finally:
        try:
            if view is not None:
                view.stop()
        finally:
            run.stop()
            gc.enable()
            gc.collect()

    rows = run.snapshot(samples=False).steps
    waits = [w for w, source in zip(rows.wait_ns, rows.source, strict=True) if source == 0]
    own: list[list[float]] = [[] for _ in range(pairs)]  # our own time in each counted next()
    if len(waits) == len(fetch_ns):  # else a wrapper that logs no fetch (the breakdown's)
        for k, pair in counted:
            own[pair].append(fetch_ns[k] - waits[k])
    traced_steps = max(1, len(fetch_ns))
    step = in_us(median_difference(whole[False], whole[True], resamples=resamples))
    inside_calls = in_us(median_difference(calls[False], calls[True], resamples=resamples))
    return Interleaved(
        pairs,
        block_steps,
        "samplers and live view" if view is not None else f"none ({why or 'not asked'})",
        pooled_median(whole[False]) / 1e3,
        pooled_median(calls[False]) / 1e3,
        *step,
        *inside_calls,
        *in_us(_median_with_interval(own, resamples)),
        loop_ns / traced_steps / 1e3,
        reader_ns / traced_steps / 1e3,
        settle_steps,
        settle_samples,
    )


def profiler_interleaved_cost(
    work: Workload, pairs: int, block_steps: int = 8, resamples: int = 2000
) -> Estimate:
    """What ``torch.profiler`` (default CPU activity) adds to the whole step, us, with a 95%
    bootstrap interval over the pairs: blocks plain and profiled in ABBA order, as in
    :func:`interleaved_cost`. A profile is started before each profiled block and stopped
    after it, outside the timing (~0.2-0.6 s each), so its buffers never grow past one block;
    the first two steps of every block are not counted."""
    from torch.profiler import ProfilerActivity, profile

    clock = time.perf_counter_ns
    it = iter(work.loader)
    whole: dict[bool, list[list[float]]] = {False: [], True: []}
    gc.collect()
    gc.disable()
    try:
        for block in range(2 * pairs):
            profiled = block % 4 in (1, 2)
            prof = profile(activities=[ProfilerActivity.CPU]) if profiled else None
            if prof is not None:
                prof.__enter__()
            steps: list[float] = []
            try:
                for i in range(-2, block_steps):
                    t0 = clock()
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(work.loader)
                        batch = next(it)
                    work.train_step(batch)
                    if i >= 0:
                        steps.append(clock() - t0)
            finally:
                if prof is not None:
                    prof.__exit__(None, None, None)
            whole[profiled].append(steps)
    finally:
        gc.enable()
        gc.collect()
    return in_us(median_difference(whole[False], whole[True], resamples=resamples))


# --- the samplers, the live view, the import -----------------------------------------------------
def sampler_idle_cost(seconds: float) -> dict[str, Any]:
    """Sampler thread CPU over ``seconds`` of an idle run at 10 Hz, in % of one core."""
    with traceml_nb.Run("bench-sampler", sample=True, interval=0.1, device="cpu") as run:
        time.sleep(seconds)
    if not run.capabilities.ok("host"):
        return {"available": False, "why": run.capabilities.why("host")}
    return {
        "available": True,
        "core_pct": 100.0 * run.sampler_busy_s / run.elapsed_s,
        "samples": len(run.record.host) if run.record.host is not None else 0,
        "seconds": run.elapsed_s,
    }


def monitor_steady_cost(work: Workload, seconds: float) -> dict[str, Any]:
    """Sampler and live-view CPU over a training run of about ``seconds`` (default rates): the
    repetitions' figures include the view's final update in runs of a fraction of a second;
    this is the steady state. Then the same run without the view, for the time the loop's own
    thread spends turning the log into rows there (``StepTracer.processing_ns``): the part of
    the view's reading that the run pays with or without it."""
    stamps: list[int] = []
    with monitored_run("bench-steady", live_view_class()) as (run, view, why):
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            run_loop(work, stamps)
    alone: list[int] = []
    with monitored_run("bench-steady-without-view", (None, "not started")) as (bare, _, _):
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            run_loop(work, alone)
    out: dict[str, Any] = {"seconds": run.elapsed_s, "steps": len(stamps)}
    tracer = bare.tracer
    if tracer is not None and alone:
        out["segmenting_us_without_view"] = tracer.processing_ns / len(alone) / 1e3
    out["sampler_core_pct"] = (
        100.0 * run.sampler_busy_s / run.elapsed_s if run.capabilities.ok("host") else None
    )
    if view is None:
        out["view"] = f"not available ({why})"
    else:
        out["view_pct"] = 100.0 * view.busy_s / run.elapsed_s
        # its parts: the rows' reading is the engine's segmenting, which the loop's thread
        # does itself without a view; the running verdict; the rest, the view's own work
        out["view_reading_pct"] = 100.0 * view.reading_s / run.elapsed_s
        out["view_verdict_pct"] = 100.0 * view.analysis_busy_s / run.elapsed_s
        out["view_reading_us"] = view.reading_s / max(1, len(stamps)) * 1e6
        without = out.get("segmenting_us_without_view")
        if without is not None:
            # the view's cost to the run: its own work and verdict, and its reading beyond
            # what the loop's thread spends on the same segmenting without a view
            beyond = max(0.0, out["view_reading_us"] - without) * len(stamps) / 1e6
            reading_s = view.reading_s
            out["view_added_pct"] = 100.0 * (view.busy_s - reading_s + beyond) / run.elapsed_s
        out["view_ticks"] = view.ticks
        out["view_messages"] = view.messages
        out["view_error"] = view.error
    return out


_IMPORT_PROBE = """
import json, sys, time
t0 = time.perf_counter()
import traceml_nb
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "loaded": [m for m in %r if m in sys.modules]}))
"""


def import_time(runs: int) -> dict[str, Any]:
    """``import traceml_nb`` in fresh interpreters: median seconds and heavy modules loaded."""
    seconds: list[float] = []
    loaded: set[str] = set()
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE % (HEAVY_MODULES,)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout
        data = json.loads(out.strip().splitlines()[-1])
        seconds.append(data["seconds"])
        loaded.update(data["loaded"])
    return {
        "median_s": statistics.median(seconds),
        "max_s": max(seconds),
        "runs": runs,
        "heavy_loaded": sorted(loaded),
    }
