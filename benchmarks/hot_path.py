"""The hot path on its own: the bare-wrapper floor, the hot path alone with cold caches, and
where its time goes.

* :func:`cold_hot_path_cost`: the run's hooks on stand-ins (``workloads.py``: a loader and an
  optimizer whose own work is nothing), caches evicted before each timed call, beside plain
  and the bare-wrapper floor in the same rotating blocks. The conv net's own noise hides
  differences of a microsecond; this measures the regime it stands for, a step that evicts
  every cache, precisely.
* The bare-wrapper floor (:func:`floor_wrap`, :func:`floor_hook`): a ``__next__`` wrapper that
  reads two clocks and keeps nothing, and an empty global post-step hook; the least any
  instrumentation of the fetch and the optimizer step can cost.
* :func:`tracer_breakdown`: ``methods.interleaved_cost`` with ``StepTracer.wrap_next`` swapped
  for wrappers that do less (``BREAKDOWN``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.optim.optimizer as optim_mod
from methods import Interleaved, in_us, interleaved_cost, pooled_median
from torch.utils.data.dataloader import _BaseDataLoaderIter
from workloads import (
    NullOptimizer,
    Workload,
    after_step,
    evictor,
    rewind,
    stand_in_iterator,
    trivial_next,
)

import traceml_nb
from traceml_nb.engine.instrument import hooks
from traceml_nb.engine.instrument.tracer import StepTracer
from traceml_nb.selfcheck.paired_stats import median_difference


# --- the bare-wrapper floor, and where the tracer's time goes -----------------------------------
def floor_wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The bare-wrapper floor's ``__next__``: reads two clocks and keeps nothing. With
    :func:`floor_hook` it is the least any instrumentation of the fetch and the optimizer step
    can cost."""
    clock = time.perf_counter_ns

    def __next__(it: Any) -> Any:
        t_enter = clock()  # noqa: F841 (read and dropped: the floor's cost is the reading)
        batch = original(it)
        t_exit = clock()  # noqa: F841
        return batch

    return __next__


def floor_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The bare-wrapper floor's optimizer side: an empty global post-step hook."""


def keeping_floor(kept: list[Any]) -> tuple[Callable[..., Any], Callable[..., None]]:
    """The floor that keeps its clocks: ``(wrap, hook)``, a ``__next__`` wrapper maker whose
    wrapper appends ``(t_enter, t_exit)`` to ``kept`` and a global post-step hook that appends
    the step's clock; the least any instrumentation that keeps what it reads can cost (every
    cold line it touches, the list's slot, the tuple, the integers, costs on a cold cache)."""
    clock = time.perf_counter_ns
    append = kept.append

    def wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def __next__(it: Any) -> Any:
            t_enter = clock()
            batch = original(it)
            append((t_enter, clock()))
            return batch

        return __next__

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        append(clock())

    return wrap, hook


def _plumbing_wrap(self: StepTracer, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def __next__(it: Any) -> Any:
        return original(it)

    return __next__


def _clocks_wrap(self: StepTracer, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return floor_wrap(original)


#: ``StepTracer.wrap_next`` replacements, one part more each (None: the real one). The
#: optimizer hook is the run's own (``StepTracer.on_optimizer_step``) throughout.
BREAKDOWN: dict[str, Any] = {
    "wrapper plumbing (calls through)": _plumbing_wrap,
    "+ two clock reads": _clocks_wrap,
    "+ the fetch logged (full tracer)": None,
}


def tracer_breakdown(
    work: Workload, pairs: int, block_steps: int = 8, settle: bool = True
) -> dict[str, Interleaved]:
    """The hooks' added time per step with the wrapper's parts switched on one by one
    (``StepTracer.wrap_next`` swapped while the run installs its hooks), each measured by
    :func:`interleaved_cost` with ``pairs`` block pairs, no samplers or view (``settle``: its
    traced start first)."""
    real = StepTracer.wrap_next
    out = {}
    try:
        for name, wrap in BREAKDOWN.items():
            StepTracer.wrap_next = wrap or real  # type: ignore[method-assign]
            interleaved_cost(work, max(2, pairs // 20), block_steps, False, 10, False)  # warm-up
            out[name] = interleaved_cost(work, pairs, block_steps, monitor=False, settle=settle)
    finally:
        StepTracer.wrap_next = real  # type: ignore[method-assign]
    return out


# --- the hot path alone, with cold caches -------------------------------------------------------
@dataclass
class ColdHotPath:
    """What the hot path adds when the caches are cold (:func:`cold_hot_path_cost`), us:
    ``fetch`` is ``next()``, ``step`` the end of the optimizer's step; ``*_plain`` the plain
    medians, ``*_added`` traced minus plain. ``added`` (per step, both calls) and ``floor_added``
    (the same for the bare-wrapper floor) with their 95% intervals; ``over_floor``: traced
    minus floor, per step, with its interval (what our hot path costs beyond the floor);
    ``keeping_*`` and ``over_keeping*`` the same for the floor that keeps its clocks
    (:func:`keeping_floor`), the one the budget reads."""

    eviction: str  #: what ran before each timed call (``workloads.EVICTIONS``)
    samples: int  #: timed calls of each variant
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
    over_floor: float
    over_floor_lo: float
    over_floor_hi: float
    keeping_added: float
    keeping_lo: float
    keeping_hi: float
    over_keeping: float
    over_keeping_lo: float
    over_keeping_hi: float


COLD_VARIANTS = ("plain", "floor", "keeping floor", "traced")


#: Untimed calls after each switch of variant (see :func:`cold_hot_path_cost`).
SWITCH_WARMUP_CALLS = 50


def cold_hot_path_cost(eviction: str, samples: int, block: int = 20) -> ColdHotPath:
    """The hot path alone, with cold caches: a real DataLoader iterator whose ``__next__`` is
    ``workloads.trivial_next`` and a real optimizer whose step does nothing, of which the end
    of torch's step wrapper is timed (``workloads.after_step``: the post-step hook loop, where
    a global hook runs). Before each timed call the caches are evicted (``workloads.evictor``).
    Rounds of four blocks of ``block`` calls each, one block a variant in an order that
    rotates from round to round: plain; the bare-wrapper floor (:func:`floor_wrap` and
    :func:`floor_hook`); the floor that keeps its clocks (:func:`keeping_floor`); traced,
    ``hooks.install`` with a run's tracer (``uninstall(pause=True)`` between its blocks, so
    its phase sampling goes on as in one long run). Fifty untimed calls
    follow each switch: installing changes the iterator classes, which invalidates the
    interpreter's specialised attribute reads of their objects until it has re-specialised
    them (a run patches the class once, at its start). The run has a reader attached
    (``Run.reading``), as with a live view: the log is segmented between blocks, untimed, so
    the samples hold the hot path only. A round is a pair for the intervals
    (``stats.median_difference``)."""
    it = stand_in_iterator()
    optimizer = NullOptimizer()
    evict = evictor(eviction)
    clock = time.perf_counter_ns
    fetch: dict[str, list[list[float]]] = {v: [] for v in COLD_VARIANTS}
    step: dict[str, list[list[float]]] = {v: [] for v in COLD_VARIANTS}
    real_next = _BaseDataLoaderIter.__dict__["__next__"]
    floor_next = floor_wrap(trivial_next)
    kept: list[Any] = []
    keeping_wrap, keeping_hook = keeping_floor(kept)
    keeping_next = keeping_wrap(trivial_next)
    _BaseDataLoaderIter.__next__ = trivial_next  # type: ignore[method-assign]
    run = traceml_nb.Run("bench-cold", sample=False, device="cpu")
    floor_handle = None
    gc.collect()
    gc.disable()
    try:
        run.start()  # installs the hooks around trivial_next
        tracer = run.tracer
        with run.reading():
            for _ in range(3):
                next(it)
                optimizer.step()
            for b in range(len(COLD_VARIANTS) * max(1, samples // block)):
                variant = COLD_VARIANTS[(b + b // len(COLD_VARIANTS)) % len(COLD_VARIANTS)]
                hooks.uninstall(pause=True)
                if floor_handle is not None:
                    floor_handle.remove()
                    floor_handle = None
                tracer.process()  # what the last block logged, untimed
                kept.clear()
                _BaseDataLoaderIter.__next__ = trivial_next  # type: ignore[method-assign]
                if variant == "traced":
                    hooks.install(tracer)
                    tracer.active = True  # uninstall() had made its wrapper call through
                elif variant == "floor":
                    _BaseDataLoaderIter.__next__ = floor_next  # type: ignore[method-assign]
                    floor_handle = optim_mod.register_optimizer_step_post_hook(floor_hook)
                elif variant == "keeping floor":
                    _BaseDataLoaderIter.__next__ = keeping_next  # type: ignore[method-assign]
                    floor_handle = optim_mod.register_optimizer_step_post_hook(keeping_hook)
                for _ in range(SWITCH_WARMUP_CALLS):
                    next(it)
                    after_step(optimizer)
                fetches: list[float] = []
                ends: list[float] = []
                for _ in range(block):
                    evict()
                    t0 = clock()
                    next(it)
                    t1 = clock()
                    evict()
                    t2 = clock()
                    after_step(optimizer)
                    t3 = clock()
                    fetches.append(t1 - t0)
                    ends.append(t3 - t2)
                    rewind(it)
                fetch[variant].append(fetches)
                step[variant].append(ends)
    finally:
        hooks.uninstall()
        if floor_handle is not None:
            floor_handle.remove()
        run.stop()
        _BaseDataLoaderIter.__next__ = real_next  # type: ignore[method-assign]
        gc.enable()
    total = {  # per call: next() and the step's end
        v: [
            [f + s for f, s in zip(fb, sb, strict=True)]
            for fb, sb in zip(fetch[v], step[v], strict=True)
        ]
        for v in COLD_VARIANTS
    }

    def added(table: dict[str, list[list[float]]], variant: str) -> float:
        return (pooled_median(table[variant]) - pooled_median(table["plain"])) / 1e3

    traced = in_us(median_difference(total["plain"], total["traced"]))
    floor = in_us(median_difference(total["plain"], total["floor"]))
    over = in_us(median_difference(total["floor"], total["traced"]))
    keeping = in_us(median_difference(total["plain"], total["keeping floor"]))
    over_keeping = in_us(median_difference(total["keeping floor"], total["traced"]))
    return ColdHotPath(
        eviction,
        sum(len(b) for b in total["traced"]),
        pooled_median(fetch["plain"]) / 1e3,
        added(fetch, "traced"),
        pooled_median(step["plain"]) / 1e3,
        added(step, "traced"),
        *traced,
        added(fetch, "floor"),
        added(step, "floor"),
        *floor,
        *over,
        *keeping,
        *over_keeping,
    )
