"""What traceml_nb costs a training loop, against plain training and ``torch.profiler``.

One process runs the same CPU training loop (a real ``DataLoader`` over an in-memory
``TensorDataset``, ``num_workers=0``, with an optimizer) in several variants, alternating::

    plain       the loop as the user wrote it
    tracer      traceml_nb.Run(sample=False): the step tracer alone (DataLoader wrapper and
                optimizer step counting), no background thread
    monitor     the full monitor: traceml_nb.Run with its samplers at 10 Hz plus the live
                view's writer running headless (LiveView(run, display=False))
    profiler    torch.profiler.profile with its default CPU activity

Each repetition runs every variant once; the order rotates from one repetition to the next
(A B C D, B C D A, ...) so that no variant always follows the same one. Only the loop is
timed (``time.perf_counter_ns``, garbage collector off for every variant alike); starting and
stopping a variant is timed apart and reported as a fixed cost. The added time per step of a
variant is ``(variant loop time - plain loop time) / steps`` for the two runs of the same
repetition; the table gives the median over repetitions and the min-max.

Also measured: the hot path alone with cold caches (``cold_hot_path_cost``: a stand-in
loader and optimizer, 24 or 64 MB written or a small conv step run before each call, precise
where the conv net's own noise is not), the sampler thread's CPU (``Run.sampler_busy_s`` /
run time), the live view's thread CPU, memory per step over a 1,000,000-step synthetic run
(benchmarks/memory.py), and the time of ``import traceml_nb`` in a fresh interpreter.

Usage::

    .venv/bin/python benchmarks/overhead.py            # the full benchmark (~21 minutes)
    .venv/bin/python benchmarks/overhead.py --quick    # seconds; what the smoke test runs
    .venv/bin/python benchmarks/overhead.py --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.optim.optimizer as optim_mod
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the checkout, when traceml_nb is not installed

import memory  # noqa: E402  (benchmarks/memory.py, beside this file)

import traceml_nb  # noqa: E402

#: The issue's budgets (a 2-core CPU VM).
BUDGET_ADDED_US = 5.0  #: median added host time per step, microseconds
BUDGET_PROFILER_RATIO = 30.0  #: torch.profiler must add at least this many times more
BUDGET_SAMPLER_CORE_PCT = 1.0  #: sampler thread CPU, % of one core at 10 Hz
BUDGET_VIEW_PCT = 1.0  #: live view CPU, % of the run time at its default rate
BUDGET_BYTES_PER_STEP = 100.0
BUDGET_IMPORT_S = 0.3
#: The whole step's figure is the budget's when its 95% interval is at most this wide (us);
#: otherwise the figure inside ``next()`` and ``optimizer.step()`` (see ``Interleaved``).
PRECISE_INTERVAL_US = 2.0

#: Packages that ``import traceml_nb`` must not pull in (they are imported when used).
HEAVY_MODULES = ("torch", "IPython", "bokeh", "pynvml", "psutil", "numpy", "pandas", "ipywidgets")


# --- workloads ----------------------------------------------------------------------------------
@dataclass
class Workload:
    """A training loop: ``loader`` batches fed to ``compute`` (zero_grad, forward, backward),
    then ``optimizer.step()``; ``steps`` per repetition."""

    name: str
    loader: DataLoader
    compute: Callable[[Any], None]
    optimizer: torch.optim.Optimizer
    steps: int

    def train_step(self, batch: Any) -> None:
        self.compute(batch)
        self.optimizer.step()


def _classifier_loop(
    name: str, model: nn.Module, inputs: torch.Tensor, batch: int, steps: int
) -> Workload:
    targets = torch.randint(0, 10, (inputs.shape[0],), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=batch, num_workers=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def compute(batch_: Any) -> None:
        x, y = batch_
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    return Workload(name, loader, compute, optimizer, steps)


def bare_loop(steps: int) -> Workload:
    """No model: a loader batch of 64 rows and an ``optimizer.step()`` on one parameter, about
    0.1 ms a step. The smallest denominator, so the added microseconds are measured most precisely."""
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    inputs = torch.randn(64 * min(steps, 200), 32)
    targets = torch.zeros(inputs.shape[0], dtype=torch.long)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=64, num_workers=0)

    def compute(batch_: Any) -> None:
        return None

    return Workload("bare loop", loader, compute, optimizer, steps)


def tiny_mlp(steps: int) -> Workload:
    """An MLP of ~21k parameters, batch 64: about 0.5 ms a step on the 2-core VM."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    inputs = torch.randn(64 * min(steps, 200), 32)
    return _classifier_loop("tiny MLP", model, inputs, 64, steps)


def small_convnet(steps: int) -> Workload:
    """Three 3x3 convolutions on 3x32x32 images, batch 20: about 20 ms a step on the 2-core VM."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    inputs = torch.randn(20 * min(steps, 25), 3, 32, 32)
    return _classifier_loop("small conv net", model, inputs, 20, steps)


def run_loop(work: Workload, stamps: list[int]) -> None:
    """``work.steps`` training steps, over as many epochs of the loader as that takes;
    appends ``perf_counter_ns()`` after each step to ``stamps`` (the same ~0.1 us in every
    variant)."""
    clock = time.perf_counter_ns
    append = stamps.append
    done = 0
    while done < work.steps:
        for batch in work.loader:
            work.train_step(batch)
            append(clock())
            done += 1
            if done == work.steps:
                return


# --- variants -----------------------------------------------------------------------------------
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
    processing_ns: int | None = None  #: the tracer turning its log into rows, during the loop


def _live_view_class() -> tuple[Any, str]:
    """``(LiveView, '')`` or ``(None, why it is not available)``."""
    try:
        from traceml_nb.views.live import LiveView
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return LiveView, ""


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
    t0 = time.perf_counter_ns()
    run = traceml_nb.Run("bench-tracer", sample=False, device="cpu")
    run.start()
    setup = time.perf_counter_ns() - t0
    try:
        loop = _timed_loop(work)
        processing = run._tracer.processing_ns
    finally:
        t1 = time.perf_counter_ns()
        run.stop()
        teardown = time.perf_counter_ns() - t1
    return Timing(*loop, setup, teardown, run_ns=run.record.elapsed_ns, processing_ns=processing)


def time_monitor(work: Workload) -> Timing:
    """The full monitor: samplers on (10 Hz) and the live view's writer running headless."""
    live_view, why = _live_view_class()
    t0 = time.perf_counter_ns()
    run = traceml_nb.Run("bench-monitor", sample=True, interval=0.1, device="cpu")
    run.start()
    view = None
    notes: list[str] = []
    try:
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
        else:
            notes.append(f"view: not available ({why})")
        setup = time.perf_counter_ns() - t0
        loop = _timed_loop(work)
        processing = run._tracer.processing_ns
    finally:
        t1 = time.perf_counter_ns()
        try:
            if view is not None:
                getattr(view, "close", view.stop)()
        finally:
            run.stop()
        teardown = time.perf_counter_ns() - t1
    busy = int(run.sampler_busy_s * 1e9) if run._collector is not None else None
    view_cpu = None
    if view is not None:
        view_cpu = int(float(getattr(view, "busy_s", 0.0)) * 1e9)
        if getattr(view, "error", None):
            notes.append(f"view error: {view.error}")
    for note in run.capabilities.notes:
        if note not in notes:
            notes.append(note)
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


def measure(work: Workload, reps: int, log: Callable[[str], None]) -> dict[str, list[Timing]]:
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


# --- statistics ---------------------------------------------------------------------------------
@dataclass
class Added:
    """Added time per step of a variant over plain, from paired repetitions."""

    median_us: float
    min_us: float
    max_us: float
    median_pct: float
    min_pct: float
    max_pct: float


def added_per_step(plain_ns: list[int], variant_ns: list[int], steps: int) -> Added:
    """Per repetition pair: ``(variant - plain) / steps`` in us and in % of the plain step."""
    us = [(v - p) / steps / 1e3 for p, v in zip(plain_ns, variant_ns, strict=True)]
    pct = [100.0 * (v - p) / p for p, v in zip(plain_ns, variant_ns, strict=True)]
    return Added(
        statistics.median(us), min(us), max(us), statistics.median(pct), min(pct), max(pct)
    )


def profiler_ratio(profiler_us: float, monitor_us: float) -> float | None:
    """How many times more the profiler adds than the monitor; None when either adds nothing
    measurable (a median added time of zero or less: the noise is larger than the cost)."""
    if monitor_us <= 0 or profiler_us <= 0:
        return None
    return profiler_us / monitor_us


# --- interleaved blocks: the hot path's cost with drift cancelled ------------------------------
@dataclass
class Interleaved:
    """Added host time per step of the tracer's hot path (DataLoader wrapper and optimizer
    hook), from one loop whose blocks of steps alternate between plain and traced.

    ``step_*``: the whole step (``next()`` to the end of ``optimizer.step()``); ``calls_*``:
    only the time inside ``next()`` and ``optimizer.step()``, where the tracer's code runs
    (a quieter figure: the model's forward and backward, and their noise, are left out).
    Figures are median traced step minus median plain step, in us, with a 95% bootstrap
    interval over block pairs (``*_lo`` .. ``*_hi``).

    ``own_next_*``: the wrapper's own time inside ``next()``, measured step by step against
    the tracer's own clocks (time in ``next()`` minus the data wait the tracer logged for that
    fetch, so the loader's noise cancels): its median, and its 95% bootstrap interval. Not a
    marginal cost: when the caches are cold, the wrapper takes misses that the loader's own
    code would otherwise take a moment later (on the conv net it reads ~8 us where the
    marginal cost inside ``next()`` is ~3 us), so it is shown, not used for the budget.

    ``loop_processing_us`` / ``reader_processing_us``: the tracer turning its log into rows,
    per traced step, on the loop's thread and on the live view's thread.
    """

    pairs: int
    block_steps: int
    monitor: str  #: what ran besides the tracer: the samplers and live view, or nothing
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


def median_difference_us(plain: Any, variant: Any, picks: Any) -> tuple[float, float, float]:
    """``median(variant) - median(plain)`` of two (block pairs x steps) tables of ns, in us,
    with its 95% bootstrap interval: each row of ``picks`` resamples the block pairs."""
    import numpy as np

    boot = [np.median(variant[pick]) - np.median(plain[pick]) for pick in picks]
    lo, hi = np.quantile(np.asarray(boot, dtype=float), [0.025, 0.975])
    point = float(np.median(variant) - np.median(plain))
    return point / 1e3, float(lo) / 1e3, float(hi) / 1e3


def interleaved_cost(
    work: Workload, pairs: int, block_steps: int = 8, resamples: int = 2000, monitor: bool = True
) -> Interleaved:
    """``pairs`` pairs of ``block_steps``-step blocks, one plain and one traced each, in the
    order plain-traced, traced-plain, ... (ABBA: a linear drift cancels); the loader's iterator
    carries on across blocks. One run lasts the whole loop, with ``monitor`` its samplers
    (10 Hz) and the headless live view as well, running through the plain blocks too; the
    run's DataLoader wrapper and optimizer counting are installed for the traced blocks and removed
    for the plain ones, so the tracer lives as in a long run: its log grows over the traced
    blocks and is processed by the live view's thread (or, without one, by the loop when it
    is long or 0.5 s old; that pause is left to the medians and timed apart, see
    ``StepTracer.processing_ns``). The first two steps of every block (plain too) are not
    counted: installing or removing the hooks invalidates type caches. The garbage collector
    is off throughout, as in the repetitions."""
    import numpy as np

    from traceml_nb.instrument import patches

    clock = time.perf_counter_ns
    optimizer_step = work.optimizer.step
    it = iter(work.loader)
    shape = (pairs, block_steps)
    whole = {False: np.zeros(shape), True: np.zeros(shape)}
    calls = {False: np.zeros(shape), True: np.zeros(shape)}
    fetch_ns: list[int] = []  # every traced next(), in order (a row of the run's steps each)
    counted: list[tuple[int, int]] = []  # (index in fetch_ns, flat index in the tables)
    live_view, why = _live_view_class() if monitor else (None, "")
    run = traceml_nb.Run("bench-interleaved", sample=monitor, interval=0.1, device="cpu")
    view = None
    gc.collect()
    gc.disable()
    run.start()
    tracer = run._tracer
    try:
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
        patches.uninstall()  # the first block is plain
        for block in range(2 * pairs):
            traced = block % 4 in (1, 2)
            if traced:
                patches.install(tracer)
                tracer.active = True  # uninstall() had made its wrapper call through
            try:
                row = block // 2
                for i in range(-2, block_steps):
                    single_fetch = True
                    t0 = clock()
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(work.loader)
                        batch = next(it)
                        single_fetch = False  # two fetches: no own time for this step
                    t1 = clock()
                    work.compute(batch)
                    t2 = clock()
                    optimizer_step()
                    t3 = clock()
                    if traced:
                        fetch_ns.append(t1 - t0)
                    if i >= 0:
                        whole[traced][row, i] = t3 - t0
                        calls[traced][row, i] = (t1 - t0) + (t3 - t2)
                        if traced and single_fetch:
                            counted.append((len(fetch_ns) - 1, row * block_steps + i))
            finally:
                if traced:
                    patches.uninstall()
    finally:
        try:
            run.stop()
        finally:
            if view is not None:
                view.stop()
            gc.enable()
            gc.collect()

    steps = run.record.steps.snapshot()
    waits = np.asarray(steps.wait_ns)[np.asarray(steps.source) == 0]
    own = np.full(shape, np.nan)  # the wrapper's own time in each counted traced next()
    if len(waits) == len(fetch_ns):  # else a stand-in wrapper that logs nothing (breakdown)
        for k, flat in counted:
            own.flat[flat] = fetch_ns[k] - waits[k]
    traced_steps = len(fetch_ns)

    rng = np.random.default_rng(0)
    picks = rng.integers(0, pairs, size=(resamples, pairs))

    def interval(point: float, boot: Any) -> tuple[float, float, float]:
        lo, hi = np.quantile(np.asarray(boot, dtype=float), [0.025, 0.975])
        return point / 1e3, float(lo) / 1e3, float(hi) / 1e3

    def added(table: dict[bool, Any]) -> tuple[float, float, float]:
        return median_difference_us(table[False], table[True], picks)

    def own_next(pick: Any) -> float:
        return float(np.nanmedian(own[pick])) if not np.isnan(own).all() else float("nan")

    return Interleaved(
        pairs,
        block_steps,
        "samplers and live view" if view is not None else f"none ({why or 'not asked'})",
        float(np.median(whole[False])) / 1e3,
        float(np.median(calls[False])) / 1e3,
        *added(whole),
        *added(calls),
        *interval(own_next(slice(None)), [own_next(pick) for pick in picks]),
        tracer.processing_ns / traced_steps / 1e3,
        tracer.reader_processing_ns / traced_steps / 1e3,
    )


def profiler_interleaved_cost(
    work: Workload, pairs: int, block_steps: int = 8, resamples: int = 2000
) -> tuple[float, float, float]:
    """What ``torch.profiler`` (default CPU activity) adds to the whole step, us, with a 95%
    bootstrap interval: ``pairs`` pairs of ``block_steps``-step blocks, plain and profiled in
    ABBA order, as :func:`interleaved_cost` does for the tracer. A profile is started before
    each profiled block and stopped after it, outside the timing (~0.2-0.6 s each), so its
    event buffers never grow past one block; the first two steps of every block are not
    counted. The denominator of the ratio, where the repetitions' median step moves by
    hundreds of µs between repetitions (the conv net)."""
    import numpy as np
    from torch.profiler import ProfilerActivity, profile

    clock = time.perf_counter_ns
    it = iter(work.loader)
    whole = {False: np.zeros((pairs, block_steps)), True: np.zeros((pairs, block_steps))}
    gc.collect()
    gc.disable()
    try:
        for block in range(2 * pairs):
            profiled = block % 4 in (1, 2)
            prof = profile(activities=[ProfilerActivity.CPU]) if profiled else None
            if prof is not None:
                prof.__enter__()
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
                        whole[profiled][block // 2, i] = clock() - t0
            finally:
                if prof is not None:
                    prof.__exit__(None, None, None)
    finally:
        gc.enable()
        gc.collect()
    picks = np.random.default_rng(0).integers(0, pairs, size=(resamples, pairs))
    return median_difference_us(whole[False], whole[True], picks)


# --- import time --------------------------------------------------------------------------------
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
            cwd=HERE.parent,
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


# --- sampler CPU at rest ------------------------------------------------------------------------
def sampler_idle_cost(seconds: float) -> dict[str, Any]:
    """Sampler thread CPU over ``seconds`` of an idle run at 10 Hz, in % of one core."""
    with traceml_nb.Run("bench-sampler", sample=True, interval=0.1, device="cpu") as run:
        time.sleep(seconds)
    if run._collector is None:
        return {
            "available": False,
            "why": "; ".join(run.capabilities.notes) or "no sampler started",
        }
    return {
        "available": True,
        "core_pct": 100.0 * run.sampler_busy_s / run.elapsed_s,
        "ticks": run._collector.ticks,
        "seconds": run.elapsed_s,
    }


def monitor_steady_cost(work: Workload, seconds: float) -> dict[str, Any]:
    """Sampler and live-view CPU over a training run of about ``seconds`` (default rates):
    the per-repetition figures include the view's final update in runs of a fraction of a
    second; this is the steady state."""
    live_view, why = _live_view_class()
    run = traceml_nb.Run("bench-steady", sample=True, interval=0.1, device="cpu")
    run.start()
    view = None
    try:
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
        deadline = time.perf_counter() + seconds
        stamps: list[int] = []
        while time.perf_counter() < deadline:
            run_loop(work, stamps)
    finally:
        try:
            if view is not None:
                getattr(view, "close", view.stop)()
        finally:
            run.stop()
    out: dict[str, Any] = {"seconds": run.elapsed_s, "steps": len(stamps)}
    out["sampler_core_pct"] = (
        100.0 * run.sampler_busy_s / run.elapsed_s if run._collector is not None else None
    )
    if view is None:
        out["view"] = f"not available ({why})"
    else:
        out["view_pct"] = 100.0 * float(getattr(view, "busy_s", 0.0)) / run.elapsed_s
        out["view_ticks"] = getattr(view, "ticks", None)
        out["view_messages"] = getattr(view, "messages", None)
        out["view_error"] = getattr(view, "error", None)
    return out


# --- where the tracer's time goes --------------------------------------------------------------
def _inert_wrap(self: Any, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def __next__(it: Any) -> Any:
        return original(it)

    return __next__


def _clocks_wrap(self: Any, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    tracer = self

    def __next__(it: Any) -> Any:
        clock = tracer.clock
        clock()
        batch = original(it)
        clock()
        return batch

    return __next__


#: Tracer variants with parts switched off: the ``wrap_next`` replacement (None = the real
#: one). Optimizer steps are counted as in a real run throughout (``patches``: in C once a
#: loader has closed a step).
BREAKDOWN: dict[str, Any] = {
    "wrapper plumbing": _inert_wrap,
    "+ two clock reads": _clocks_wrap,
    "+ the fetch logged (full tracer)": None,
}


def tracer_breakdown(work: Workload, pairs: int) -> dict[str, Any]:
    """The tracer's added time per step with its parts switched on one by one
    (``StepTracer.wrap_next`` swapped for the run), each measured by :func:`interleaved_cost`
    with ``pairs`` block pairs."""
    from traceml_nb.instrument.tracer import StepTracer

    real = StepTracer.wrap_next
    out = {}
    try:
        for name, wrap in BREAKDOWN.items():
            StepTracer.wrap_next = wrap or real  # type: ignore[method-assign]
            interleaved_cost(work, max(2, pairs // 20), monitor=False)  # warm-up
            out[name] = interleaved_cost(work, pairs, monitor=False).__dict__
    finally:
        StepTracer.wrap_next = real  # type: ignore[method-assign]
    return out


@dataclass
class ColdHotPath:
    """What the hot path adds when the caches are cold, measured alone (see
    :func:`cold_hot_path_cost`): medians of plain and traced, added (traced - plain) with its
    95% bootstrap interval, all us; ``fetch`` is ``next()``, ``step`` the optimizer's step.
    ``floor_*``: the same for the issue's reference floor (:func:`_floor_wrap` and an empty
    global post-step hook), measured in the same blocks."""

    eviction: str  #: what ran before each timed call (:data:`EVICTIONS`)
    samples: int
    fetch_plain: float
    fetch_added: float
    step_plain: float
    step_added: float
    added: float
    added_lo: float
    added_hi: float
    floor_fetch_added: float
    floor_step_added: float
    floor_added: float
    floor_lo: float
    floor_hi: float


class _NullOptimizer(torch.optim.Optimizer):
    """A real ``torch.optim.Optimizer`` whose ``step()`` does nothing."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1, requires_grad=True)], {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


def _after_step(optimizer: torch.optim.Optimizer) -> None:
    """The part of torch's ``Optimizer.step`` wrapper (``Optimizer.profile_hook_step``) that
    our counting touches, as torch writes it: the ``_optimizer_step_code()`` call and the
    post-step hook loop. The rest of the wrapper (a ``record_function`` op, ~60 us cold)
    is the same with and without the tracer, and would bury the difference in its noise."""
    optimizer._optimizer_step_code()  # type: ignore[attr-defined]
    for post_hook in itertools.chain(
        optimizer._optimizer_step_post_hooks.values(),  # type: ignore[attr-defined]
        optim_mod._global_optimizer_post_hooks.values(),
    ):
        post_hook(optimizer, (), {})


#: What runs before each timed call of :func:`cold_hot_path_cost`.
EVICTIONS = ("24 MB", "64 MB", "conv step")


def _evictor(eviction: str) -> Callable[[], None]:
    """``"24 MB"`` / ``"64 MB"``: write that much (evicts data: 24 MB fits in this VM's 32 MB L3
    with what it evicts, 64 MB goes to memory, TLB included); ``"conv step"``: a forward and
    backward of the small conv net on 4 images (evicts code as well: oneDNN kernels, autograd,
    the interpreter's other paths, as the conv net's own step does)."""
    if eviction == "conv step":
        work = small_convnet(1)
        batch = next(iter(DataLoader(work.loader.dataset, batch_size=4)))
        return partial(work.compute, batch)
    mb = int(eviction.split()[0])
    return partial(torch.Tensor.add_, torch.zeros(mb * (1 << 20) // 4), 1.0)


_trivial_batch: Any = None


def _trivial_next(self: Any) -> Any:
    """The stand-in loader's ``__next__`` (a module function, so that the run recompiles it
    with the hot path inside, as it does torch's)."""
    self._num_yielded += 1
    return _trivial_batch


def _floor_wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The issue's reference floor for the fetch: a bare ``__next__`` wrapper that reads two
    clocks and keeps nothing (with :func:`_floor_hook`, "+0.6 us a step" in the issue)."""
    clock = time.perf_counter_ns

    def __next__(it: Any) -> Any:
        t_enter = clock()  # noqa: F841 (read and dropped: the floor's cost is the reading)
        batch = original(it)
        t_exit = clock()  # noqa: F841
        return batch

    return __next__


def _floor_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The issue's reference floor for the optimizer: an empty global post-step hook."""


def cold_hot_path_cost(eviction: str, samples: int, block: int = 20) -> ColdHotPath:
    """The hot path alone, with cold caches: a real DataLoader iterator whose own ``__next__``
    is replaced by a trivial one (the loader's code, and its noise, left out), and a real
    optimizer whose step does nothing (see :func:`_after_step`). Before each timed ``next()``
    and each timed step, the caches are evicted (``eviction``: see :func:`_evictor`). Blocks
    of ``block`` samples rotate between plain, the issue's reference floor (a bare wrapper
    with two clock reads, :func:`_floor_wrap`, and an empty global post-step hook) and traced
    (the run's patches installed), in an order that rotates too, five untimed calls after
    each switch (installing invalidates type caches). Writing a buffer evicts data only; after
    a conv step the interpreter's own code is cold too, as in the conv net's loop, where the
    hot path costs about as much as after the conv step here."""
    import numpy as np
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from traceml_nb.instrument import patches

    n = 64 * 1000
    loader = DataLoader(TensorDataset(torch.zeros(n, 3), torch.zeros(n)), batch_size=64)
    it = iter(loader)
    batch = next(it)

    global _trivial_batch
    _trivial_batch = batch
    optimizer = _NullOptimizer()
    evict = _evictor(eviction)
    clock = time.perf_counter_ns
    variants = ("plain", "floor", "traced")
    times: dict[str, tuple[list[int], list[int]]] = {v: ([], []) for v in variants}
    real_next = _BaseDataLoaderIter.__dict__["__next__"]
    floor_next = _floor_wrap(_trivial_next)
    _BaseDataLoaderIter.__next__ = _trivial_next  # type: ignore[method-assign]
    run = traceml_nb.Run("bench-cold", sample=False, device="cpu")
    hook = None
    gc.collect()
    gc.disable()
    try:
        run.start()
        tracer = run._tracer
        for _ in range(3):
            next(it)
            optimizer.step()
        run.process_steps()  # a loader step is known: optimizer steps are counted in C
        for _ in range(3):
            next(it)
            optimizer.step()
        for b in range(len(variants) * (samples // block)):
            variant = variants[(b + b // len(variants)) % len(variants)]
            patches.uninstall()
            if hook is not None:
                hook.remove()
                hook = None
            _BaseDataLoaderIter.__next__ = _trivial_next  # type: ignore[method-assign]
            if variant == "traced":
                patches.install(tracer)  # recompiles _trivial_next, never the floor's wrapper
                tracer.active = True
            elif variant == "floor":
                _BaseDataLoaderIter.__next__ = floor_next  # type: ignore[method-assign,assignment]
                hook = optim_mod.register_optimizer_step_post_hook(_floor_hook)
            for _ in range(5):
                next(it)
                _after_step(optimizer)
            for _ in range(block):
                evict()
                t0 = clock()
                next(it)
                t1 = clock()
                evict()
                t2 = clock()
                _after_step(optimizer)
                t3 = clock()
                times[variant][0].append(t1 - t0)
                times[variant][1].append(t3 - t2)
                if it._num_yielded > n // 64 - 100:
                    it._num_yielded = 1  # never the epoch's end; the sampler is not used
    finally:
        patches.uninstall()
        if hook is not None:
            hook.remove()
        run.stop()
        _BaseDataLoaderIter.__next__ = real_next  # type: ignore[method-assign]
        gc.enable()
    fetch = {k: np.asarray(v[0]) / 1e3 for k, v in times.items()}
    step = {k: np.asarray(v[1]) / 1e3 for k, v in times.items()}
    total = {k: fetch[k] + step[k] for k in times}
    rng = np.random.default_rng(0)

    def added(table: dict[str, Any], variant: str) -> float:
        return float(np.median(table[variant]) - np.median(table["plain"]))

    def interval(variant: str) -> tuple[float, float]:
        boot = []
        for _ in range(1000):
            picks = {k: rng.integers(0, len(total[k]), len(total[k])) for k in total}
            boot.append(
                np.median(total[variant][picks[variant]])
                - np.median(total["plain"][picks["plain"]])
            )
        lo, hi = np.quantile(boot, [0.025, 0.975])
        return float(lo), float(hi)

    return ColdHotPath(
        eviction,
        len(total["traced"]),
        float(np.median(fetch["plain"])),
        added(fetch, "traced"),
        float(np.median(step["plain"])),
        added(step, "traced"),
        added(total, "traced"),
        *interval("traced"),
        added(fetch, "floor"),
        added(step, "floor"),
        added(total, "floor"),
        *interval("floor"),
    )


def cold_hot_path_lines(costs: list[ColdHotPath]) -> list[str]:
    lines = [
        "hot path alone, caches evicted before each call (a stand-in loader and optimizer);",
        "  'floor': the issue's reference floor, a bare wrapper with two clock reads and an empty",
        "  global post-step hook, in the same blocks:",
    ]
    for c in costs:
        after = c.eviction if c.eviction == "conv step" else f"writing {c.eviction}"
        lines.append(
            f"  after {after}: next() {c.fetch_plain:.2f} us plain, "
            f"{c.fetch_added:+.2f} traced ({c.floor_fetch_added:+.2f} floor); optimizer step's "
            f"end {c.step_plain:.2f} us plain, {c.step_added:+.2f} traced "
            f"({c.floor_step_added:+.2f} floor); added per step {c.added:+.2f} us "
            f"[{c.added_lo:+.2f}, {c.added_hi:+.2f}], floor {c.floor_added:+.2f} us "
            f"[{c.floor_lo:+.2f}, {c.floor_hi:+.2f}] ({c.samples} samples each)"
        )
    return lines


# --- report -------------------------------------------------------------------------------------
def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
        "platform": platform.platform(),
    }


def _fmt_range(lo: float, hi: float, digits: int) -> str:
    return f"{lo:.{digits}f} .. {hi:.{digits}f}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("ok" if ok else "OVER")


def _ratio_text(ratio: float | None) -> str:
    return "n/a (an added time at or below zero: noise)" if ratio is None else f"{ratio:.0f}x"


def overhead_table(
    work: Workload,
    results: dict[str, list[Timing]],
    inter: Interleaved,
    prof: tuple[int, float, float, float] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """The table of one loop, and its figures for the JSON report.

    Two estimates of the added time per step, both per repetition pair: ``loop`` is the
    issue's definition, (variant loop - plain loop) / steps, which holds every cost (sampler
    ticks included) and every burst of noise; ``step`` compares the median single step of
    each loop, which ignores what happens on a minority of steps (noise from other processes,
    but also our own sampler ticks) and so shows the per-step hot path cost more precisely.
    """
    plain = [t.loop_ns for t in results["plain"]]
    plain_step = [t.median_step_ns for t in results["plain"]]
    step_us = statistics.median(plain) / work.steps / 1e3
    lo, hi = min(plain) / work.steps / 1e3, max(plain) / work.steps / 1e3
    lines = [
        f"{work.name}: {work.steps} steps x {len(plain)} repetitions, plain step {step_us:.1f} us "
        f"(min-max {_fmt_range(lo, hi, 1)}; median single step "
        f"{statistics.median(plain_step) / 1e3:.1f} us)",
        f"  {'':<9} {'-- (loop time - plain) / steps --':^59} {'-- median step --':^29}",
        f"  {'variant':<9} {'added us':>9} {'min .. max us':>20} {'added %':>9} {'min .. max %':>18}"
        f" {'added us':>9} {'min .. max us':>19} {'start+stop ms':>14}",
    ]
    data: dict[str, Any] = {
        "steps": work.steps,
        "reps": len(plain),
        "plain_step_us": step_us,
        "plain_median_step_us": statistics.median(plain_step) / 1e3,
        "variants": {},
    }
    for name in VARIANTS:
        if name == "plain":
            continue
        timings = results[name]
        a = added_per_step(plain, [t.loop_ns for t in timings], work.steps)
        m = [(t.median_step_ns - p) / 1e3 for p, t in zip(plain_step, timings, strict=True)]
        m_med, m_lo, m_hi = statistics.median(m), min(m), max(m)
        fixed_ms = statistics.median(t.setup_ns + t.teardown_ns for t in timings) / 1e6
        lines.append(
            f"  {name:<9} {a.median_us:>9.2f} {_fmt_range(a.min_us, a.max_us, 2):>20}"
            f" {a.median_pct:>8.3f}% {_fmt_range(a.min_pct, a.max_pct, 3):>18}"
            f" {m_med:>9.2f} {_fmt_range(m_lo, m_hi, 2):>19} {fixed_ms:>14.1f}"
        )
        data["variants"][name] = {
            **a.__dict__,
            "median_step_us": m_med,
            "median_step_min_us": m_lo,
            "median_step_max_us": m_hi,
            "start_stop_ms": fixed_ms,
        }
    v = data["variants"]
    ratio = profiler_ratio(v["profiler"]["median_us"], v["monitor"]["median_us"])
    ratio_step = profiler_ratio(v["profiler"]["median_step_us"], v["monitor"]["median_step_us"])
    data["profiler_over_monitor"] = ratio
    data["profiler_over_monitor_median_step"] = ratio_step
    lines.append(
        f"  profiler-added / monitor-added: {_ratio_text(ratio)} (loop time), "
        f"{_ratio_text(ratio_step)} (median step)"
    )
    pct = 100.0 * inter.step_us / inter.plain_step_us
    lines.append(
        f"  hot path, interleaved ({inter.pairs} pairs of {inter.block_steps}-step blocks, "
        f"plain step {inter.plain_step_us:.1f} us; running alongside: {inter.monitor}):"
    )
    lines.append(
        f"    whole step {inter.step_us:+.2f} us [{inter.step_lo:+.2f}, {inter.step_hi:+.2f}] "
        f"= {pct:+.3f}%; inside next() and optimizer.step() {inter.calls_us:+.2f} us "
        f"[{inter.calls_lo:+.2f}, {inter.calls_hi:+.2f}]; the wrapper's own time in next() "
        f"{inter.own_next_us:.2f} us [{inter.own_next_lo:.2f}, {inter.own_next_hi:.2f}]"
    )
    inline = [
        t.processing_ns / work.steps / 1e3 for t in results["tracer"] if t.processing_ns is not None
    ]
    inline_us = statistics.median(inline) if inline else float("nan")
    lines.append(
        f"  processing the log into rows, per step: {inter.reader_processing_us:.2f} us on the "
        f"live view's thread and {inter.loop_processing_us:.2f} us on the loop's (interleaved "
        f"run); {inline_us:.2f} us on the loop's without a view (tracer repetitions, median)"
    )
    precise = inter.step_hi - inter.step_lo <= PRECISE_INTERVAL_US
    hot, hot_lo, hot_hi = (
        (inter.step_us, inter.step_lo, inter.step_hi)
        if precise
        else (inter.calls_us, inter.calls_lo, inter.calls_hi)
    )
    which = "whole step" if precise else "inside the calls: the whole step's is too wide"
    processing_us = inter.loop_processing_us
    total_us = hot + processing_us
    total_lo, total_hi = hot_lo + processing_us, hot_hi + processing_us
    lines.append(
        f"  added per step = hot path ({which}) + the loop's processing: {total_us:+.2f} us "
        f"[{total_lo:+.2f}, {total_hi:+.2f}] = {100.0 * total_us / inter.plain_step_us:+.3f}%"
    )
    # The ratio's numerator: torch.profiler's added whole step from its own interleaved blocks
    # (prof: pairs, us, lo, hi) where measured, else from the repetitions' median steps.
    profiler_us, source = v["profiler"]["median_step_us"], "median step"
    if prof is not None:
        pairs_p, profiler_us, p_lo, p_hi = prof
        source = "interleaved"
        data["profiler_interleaved"] = {"pairs": pairs_p, "us": profiler_us, "lo": p_lo, "hi": p_hi}
        lines.append(
            f"  torch.profiler, interleaved ({pairs_p} pairs of {inter.block_steps}-step blocks): "
            f"whole step {profiler_us:+.1f} us [{p_lo:+.1f}, {p_hi:+.1f}]"
        )
    ratio_hot = profiler_ratio(profiler_us, total_us)
    data["interleaved"] = {**inter.__dict__, "step_pct": pct}
    data["processing_us"] = {"inline_no_view": inline_us, "loop": processing_us}
    data["processing_us"]["view_thread"] = inter.reader_processing_us
    data["added_us"] = {"estimate": total_us, "lo": total_lo, "hi": total_hi, "hot_path": which}
    data["profiler_over_added"] = ratio_hot
    if total_hi <= BUDGET_ADDED_US:
        us_verdict = "ok: the whole 95% interval is within it"
    elif total_us <= BUDGET_ADDED_US:
        us_verdict = "unresolved: the estimate is within it, the 95% interval is not"
    else:
        us_verdict = "OVER"
    ok_ratio = ratio_hot is not None and ratio_hot >= BUDGET_PROFILER_RATIO
    data["budget_us"] = us_verdict.split(":")[0]
    data["budget_ratio_ok"] = ok_ratio
    lines.append(
        f"  budget: {total_us:.2f} us/step (<= {BUDGET_ADDED_US:.0f}: {us_verdict}); "
        f"profiler-added ({source}) / added: {_ratio_text(ratio_hot)} "
        f"(>= {BUDGET_PROFILER_RATIO:.0f}x: {_verdict(ok_ratio) if ratio_hot else 'unresolved'})"
    )
    sampler = [
        t.sampler_busy_ns / t.run_ns
        for t in results["monitor"]
        if t.sampler_busy_ns is not None and t.run_ns
    ]
    if sampler:
        pct = 100.0 * statistics.median(sampler)
        data["sampler_core_pct"] = pct
        lines.append(f"  sampler thread during the monitor runs: {pct:.2f}% of one core (median)")
    views = [
        t.view_cpu_ns / t.run_ns
        for t in results["monitor"]
        if t.view_cpu_ns is not None and t.run_ns
    ]
    if views:
        pct = 100.0 * statistics.median(views)
        data["view_pct"] = pct
        lines.append(
            f"  live view (LiveView.busy_s, final update included) during the monitor runs: "
            f"{pct:.2f}% of the run time (median)"
        )
    notes = sorted({n for t in results["monitor"] for n in t.notes})
    data["monitor_notes"] = notes
    lines.extend(f"  note: {n}" for n in notes)
    return lines, data


def print_breakdown(pairs: int, works: list[Workload], json_path: Path | None) -> int:
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": machine()}
    print(
        f"tracer breakdown, {time.strftime('%Y-%m-%d %H:%M')}: added us per step, interleaved "
        f"blocks ({pairs} pairs), 95% interval in brackets"
    )
    for work in works:
        parts = tracer_breakdown(work, pairs)
        report[work.name] = parts
        print(f"{work.name}:")
        for name, v in parts.items():
            print(
                f"  {name:<32} whole step {v['step_us']:+6.2f} [{v['step_lo']:+.2f}, "
                f"{v['step_hi']:+.2f}]   inside the calls {v['calls_us']:+6.2f} "
                f"[{v['calls_lo']:+.2f}, {v['calls_hi']:+.2f}]"
            )
    costs = [cold_hot_path_cost(e, n) for e, n in zip(EVICTIONS, (2000, 1000, 800), strict=True)]
    report["cold_hot_path"] = [c.__dict__ for c in costs]
    print("\n".join(cold_hot_path_lines(costs)))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few steps and repetitions (seconds)"
    )
    parser.add_argument("--reps", type=int, help="repetitions of the short loops (default 21)")
    parser.add_argument("--conv-reps", type=int, help="repetitions of the conv loop (default 5)")
    parser.add_argument("--steps", type=int, help="steps of the short loops (default 500)")
    parser.add_argument("--conv-steps", type=int, help="steps of the conv net loop (default 300)")
    parser.add_argument(
        "--pairs", type=int, help="block pairs of the interleaved short loops (default 1500)"
    )
    parser.add_argument(
        "--conv-pairs", type=int, help="block pairs of the interleaved conv loop (default 1000)"
    )
    parser.add_argument(
        "--profiler-pairs",
        type=int,
        help="block pairs of the interleaved torch.profiler measurement (default 60)",
    )
    parser.add_argument("--memory-steps", type=int, help="steps of the memory run (default 1e6)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared 2-core VM, OpenMP workers spinning "
        "against other processes make the loop time swing tenfold; 0 keeps torch's default)",
    )
    parser.add_argument(
        "--breakdown",
        type=int,
        metavar="PAIRS",
        help="instead of the benchmark: the tracer's cost with its parts switched on one by one, "
        "interleaved with PAIRS block pairs on the --loops (default: the bare loop and the tiny "
        "MLP), and warm/cold call costs",
    )
    parser.add_argument(
        "--loops",
        help="which loops to time, comma-separated from bare, mlp, conv (default: all three; "
        "with --breakdown: bare,mlp)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this path")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    quick = args.quick
    reps = args.reps or (2 if quick else 21)
    conv_reps = args.conv_reps or (2 if quick else 5)
    steps = args.steps or (30 if quick else 500)
    conv_steps = args.conv_steps or (3 if quick else 300)
    memory_steps = args.memory_steps or (10_000 if quick else 1_000_000)
    pairs = args.pairs or (3 if quick else 1500)
    conv_pairs = args.conv_pairs or (2 if quick else 1000)
    profiler_pairs = args.profiler_pairs or (2 if quick else 60)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.breakdown:
        chosen = args.loops.split(",") if args.loops else ["bare", "mlp"]
        makers = {"bare": bare_loop, "mlp": tiny_mlp, "conv": small_convnet}
        if not set(chosen) <= set(makers):
            parser.error(f"--loops: use bare, mlp, conv (got {args.loops})")
        works = [makers[name](300 if name == "conv" else 500) for name in chosen]
        return print_breakdown(args.breakdown, works, args.json)

    info = machine()
    live_view, why = _live_view_class()
    view_status = "available" if live_view is not None else f"not available ({why})"
    out: list[str] = [
        f"traceml_nb overhead benchmark, {time.strftime('%Y-%m-%d %H:%M')}",
        f"machine: nproc {info['nproc']}, {info['cpu']}, python {info['python']}, torch {info['torch']} "
        f"({info['torch_threads']} intra-op threads)",
        f"view: {view_status}",
        "",
    ]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": info,
        "view": view_status,
        "loops": {},
    }
    loops = {
        "bare": lambda: (bare_loop(steps), reps, pairs),
        "mlp": lambda: (tiny_mlp(steps), reps, pairs),
        "conv": lambda: (small_convnet(conv_steps), conv_reps, conv_pairs),
    }
    chosen = [name.strip() for name in (args.loops or "bare,mlp,conv").split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(loops))
    if unknown or not chosen:
        parser.error(
            f"--loops: unknown {', '.join(unknown) or '(none given)'}; use bare, mlp, conv"
        )
    plan = [loops[name]() for name in chosen]
    for work, n, pairs in plan:
        log(f"timing {work.name} ...")
        results = measure(work, n, log)
        log(f"  {work.name}: interleaved blocks, {pairs} pairs ...")
        inter = interleaved_cost(work, pairs)
        log(f"  {work.name}: torch.profiler, interleaved blocks, {profiler_pairs} pairs ...")
        prof = (profiler_pairs, *profiler_interleaved_cost(work, profiler_pairs))
        lines, data = overhead_table(work, results, inter, prof)
        out.extend(lines + [""])
        report["loops"][work.name] = data

    log("hot path alone, cold caches ...")
    sizes = (60, 40, 20) if quick else (2000, 1000, 800)
    cold = [cold_hot_path_cost(e, n) for e, n in zip(EVICTIONS, sizes, strict=True)]
    report["cold_hot_path"] = [c.__dict__ for c in cold]
    out.extend(cold_hot_path_lines(cold) + [""])

    log("sampler at rest ...")
    idle = sampler_idle_cost(0.3 if quick else 3.0)
    report["sampler_idle"] = idle
    if idle["available"]:
        ok = idle["core_pct"] <= BUDGET_SAMPLER_CORE_PCT
        out.append(
            f"sampler at 10 Hz, idle run of {idle['seconds']:.1f} s: {idle['core_pct']:.2f}% of one core "
            f"({idle['ticks']} ticks; budget {BUDGET_SAMPLER_CORE_PCT:.0f}%: {_verdict(ok)})"
        )
    else:
        out.append(f"sampler: not available ({idle['why']})")

    log("monitor steady state ...")
    steady = monitor_steady_cost(tiny_mlp(steps), 0.5 if quick else 3.0)
    report["monitor_steady"] = steady
    text = f"monitor over a {steady['seconds']:.1f} s tiny-MLP run ({steady['steps']:,} steps): "
    if steady["sampler_core_pct"] is not None:
        ok = steady["sampler_core_pct"] <= BUDGET_SAMPLER_CORE_PCT
        text += f"samplers {steady['sampler_core_pct']:.2f}% of one core ({_verdict(ok)}); "
    if "view_pct" in steady:
        ok = steady["view_pct"] <= BUDGET_VIEW_PCT
        text += (
            f"live view {steady['view_pct']:.2f}% of the run time, {steady['view_ticks']} ticks, "
            f"{steady['view_messages']} messages (budget {BUDGET_VIEW_PCT:.0f}%: {_verdict(ok)})"
        )
        if steady.get("view_error"):
            text += f"; view error: {steady['view_error']}"
    else:
        text += f"live view {steady['view']}"
    out.append(text)

    log("memory ...")
    mem = memory.memory_per_step(memory_steps)
    report["memory"] = mem
    ok = mem["bytes_per_step"] <= BUDGET_BYTES_PER_STEP
    out.append(
        f"memory: {mem['steps']:,} steps (a loader batch and an optimizer step each) -> RunRecord "
        f"{mem['record_mb']:.1f} MB, {mem['bytes_per_step']:.1f} bytes/step "
        f"(budget {BUDGET_BYTES_PER_STEP:.0f}: {_verdict(ok)}); Python heap growth "
        f"{mem['heap_bytes_per_step']:.1f} bytes/step; tracer {mem['tracer_us_per_step']:.2f} us/step called directly"
    )

    log("import time ...")
    imp = import_time(1 if quick else 7)
    report["import"] = imp
    ok = imp["median_s"] <= BUDGET_IMPORT_S
    heavy = ", ".join(imp["heavy_loaded"]) or "none"
    out.append(
        f"import traceml_nb (fresh interpreter, median of {imp['runs']}): {imp['median_s'] * 1e3:.0f} ms "
        f"(budget {BUDGET_IMPORT_S * 1e3:.0f} ms: {_verdict(ok)}); heavy packages imported: {heavy}"
    )
    print("\n".join(out), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
