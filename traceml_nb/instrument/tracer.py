"""Step segmentation: turns DataLoader fetches, optimizer steps and markers into step rows.

A step of a loader is ``[enter of fetch k, enter of fetch k+1)``: the wait for batch k plus
everything the loop did with it. Its data wait is the time inside ``__next__`` for batch k.
The exhausting fetch (``StopIteration``) closes the last step of an epoch and is not a step.

Each loader keeps its own steps (its slot is the row's ``source``). Which loader is the
training loader is decided later, from which loader was fetched last when ``optimizer.step()``
ran; eval loaders iterated in between never add to training steps: the training step they
interrupted is flagged ``FLAG_INTERLEAVED`` and their own batches are their own phase.
A fetch from one loader inside another loader's open step also adds its wait to that step,
so loaders consumed together (``zip(a, b)``) each carry the whole data wait of the step.

With no DataLoader, the steps are the intervals between the first optimizer's ``step()``
calls (several optimizers, as in a GAN, make one step); these rows are written only until a
loader has closed a step of its own (then the loader's batches are the steps, and an
optimizer row per step would only cost time and memory). Explicit markers
(``traceml_nb.step()``) make steps of their own and take precedence in the analysis.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..record import (
    FLAG_EPOCH_START,
    FLAG_INTERLEAVED,
    FLAG_OPTIMIZER_STEP,
    FLAG_TRUNCATED,
    MAX_LOADERS,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    LoaderInfo,
    RunRecord,
)
from .batch import batch_size_of
from .gpu_events import GpuStallTimer


class _LoaderState:
    __slots__ = (
        "slot",
        "info",
        "sampler_ref",
        "open_start",
        "open_wait",
        "open_batch",
        "open_meta",
        "slot_meta",
        "ev_enter",
        "ev_exit",
        "since_opt",
    )

    def __init__(self, slot: int, info: LoaderInfo, sampler_ref: Any) -> None:
        self.slot = slot
        self.info = info
        self.sampler_ref = sampler_ref  # keeps id(sampler) unique for the run
        self.open_start = -1  # -1: no step open
        self.open_wait = 0
        self.open_batch = -1
        self.slot_meta = slot << 8  # the packed (source, flags) bits of this loader's rows
        self.open_meta = self.slot_meta  # of the open step: slot << 8 | FLAG_* bits
        self.ev_enter: Any = None
        self.ev_exit: Any = None
        self.since_opt = 0  # fetches since the last optimizer step


def loader_info_from_iterator(slot: int, it: Any) -> LoaderInfo:
    """The loader's settings as seen by its iterator (the iterator keeps no loader reference)."""
    sampler = getattr(it, "_index_sampler", None)
    dataset = getattr(it, "_dataset", None)
    try:
        dataset_len: int | None = len(dataset)  # type: ignore[arg-type]
    except Exception:
        dataset_len = None
    kind = getattr(it, "_dataset_kind", 0)
    return LoaderInfo(
        slot=slot,
        num_workers=int(getattr(it, "_num_workers", 0) or 0),
        pin_memory=bool(getattr(it, "_pin_memory", False)),
        prefetch_factor=getattr(it, "_prefetch_factor", None),
        persistent_workers=bool(getattr(it, "_persistent_workers", False)),
        batch_size=getattr(sampler, "batch_size", None),
        dataset_type=type(dataset).__name__,
        dataset_len=dataset_len,
        iterable=bool(kind == 1),
    )


class StepTracer:
    """Receives the instrumented events of one run and writes step rows into its record."""

    def __init__(
        self,
        record: RunRecord,
        clock: Callable[[], int] = time.perf_counter_ns,
        gpu: GpuStallTimer | None = None,
    ) -> None:
        self.record = record
        self.clock = clock
        self.gpu = gpu
        self.t0 = record.t0_ns
        self._states: dict[int, _LoaderState] = {}
        self._current: _LoaderState | None = None
        self._lead_optimizer: int | None = None
        self._opt_prev = 0
        self._opt_wait_mark = 0  # self._wait_total at the last optimizer step
        self._marker_prev = 0
        self._marker_wait_mark = 0  # self._wait_total at the last marker
        self._wait_total = 0  # data wait of every fetch so far, ns
        self._last_batch = -1
        self._loader_steps = False  # a loader has closed a step: optimizer rows are not needed
        self._write = record.steps.packed_writer()

    # --- DataLoader -----------------------------------------------------------------------
    def fetch(self, it: Any, next_fn: Callable[[Any], Any]) -> Any:
        """Run the loader's real ``__next__`` (``next_fn``) and account for it. The hot path.

        Its cost is the per-step budget, paid between a model's backward and forward, with the
        caches cold: so it touches few objects, calls no helper on the usual path, and writes
        the closed step with a single ``extend`` of the packed step table.
        """
        clock = self.clock
        gpu = self.gpu
        first = it._num_yielded == 0
        t_enter = clock()
        ev_enter = gpu.mark() if gpu is not None else None
        try:
            batch = next_fn(it)
        except StopIteration:
            self._close_epoch(it, t_enter, ev_enter)
            raise
        t_exit = clock()
        ev_exit = gpu.mark() if gpu is not None else None

        st = self._states.get(id(it._index_sampler))
        if st is None:
            st = self._new_loader(it)
            if st is None:  # too many loaders: count nothing rather than mislabel
                return batch
        start = st.open_start
        if start >= 0:  # close this loader's previous step
            self._write(
                (
                    start - self.t0,
                    t_enter - start,
                    st.open_wait,
                    (st.open_batch << 16) | st.open_meta,
                )
            )
            if gpu is not None and st.ev_enter is not None and ev_enter is not None:
                gpu.add(len(self.record.steps) - 1, st.ev_enter, st.ev_exit, ev_enter)
            self._loader_steps = True
        wait = t_exit - t_enter
        if self._current is not st:
            self._switch_to(st, wait)
        st.since_opt += 1
        st.info.fetches += 1
        if first:
            self._first_of_epoch(st, wait)
        kind = type(batch)
        if kind is tuple or kind is list:
            try:
                size = int(batch[0].shape[0])
            except Exception:
                size = batch_size_of(batch)
        else:
            size = batch_size_of(batch)
        st.open_start = t_enter
        st.open_wait = wait
        st.open_batch = size
        st.open_meta = st.slot_meta | FLAG_EPOCH_START if first else st.slot_meta
        st.ev_enter = ev_enter
        st.ev_exit = ev_exit
        self._wait_total += wait
        self._last_batch = size
        return batch

    def _switch_to(self, st: _LoaderState, wait: int) -> None:
        """Another loader than the last one: mark the steps it interrupts, share its wait."""
        self._current = st
        if len(self._states) > 1:
            for other in self._states.values():
                if other is not st and other.open_start >= 0:
                    other.open_meta |= FLAG_INTERLEAVED
                    other.open_wait += wait  # its step waited for this batch too

    def _first_of_epoch(self, st: _LoaderState, wait: int) -> None:
        info = st.info
        info.epochs += 1
        if info.fetches == 1:
            self.record.first_fetch_wait_ns[st.slot] = wait

    def _new_loader(self, it: Any) -> _LoaderState | None:
        slot = len(self.record.loaders)
        if slot >= MAX_LOADERS:
            return None
        sampler = getattr(it, "_index_sampler", it)
        info = loader_info_from_iterator(slot, it)
        self.record.loaders.append(info)
        st = _LoaderState(slot, info, sampler)
        self._states[id(sampler)] = st
        return st

    def _close(self, st: _LoaderState, t_end: int, extra_flags: int, ev_next: Any) -> None:
        start = st.open_start
        self._write(
            (
                start - self.t0,
                t_end - start,
                st.open_wait,
                (st.open_batch << 16) | st.open_meta | extra_flags,
            )
        )
        if self.gpu is not None and ev_next is not None and st.ev_enter is not None:
            self.gpu.add(len(self.record.steps) - 1, st.ev_enter, st.ev_exit, ev_next)
        st.open_start = -1
        st.ev_enter = st.ev_exit = None

    def _close_epoch(self, it: Any, t_enter: int, ev_enter: Any) -> None:
        st = self._states.get(id(getattr(it, "_index_sampler", it)))
        if st is not None and st.open_start >= 0:
            self._close(st, t_enter, 0, ev_enter)

    # --- optimizer ------------------------------------------------------------------------
    def optimizer_step(self, optimizer: Any, *_: Any) -> None:
        """Global optimizer post-step hook."""
        rec = self.record
        rec.optimizer_steps += 1
        cur = self._current
        if cur is not None:
            # The loader fetched last is a training loader, and so is any other loader
            # fetched alongside it in this step (``zip(a, b)``), but not an eval loop that
            # ran since the last optimizer step (more batches than the training loader's).
            for st in self._states.values():
                if st is cur or (0 < st.since_opt <= cur.since_opt and st.open_start >= 0):
                    st.info.optimizer_steps += 1
                    st.open_meta |= FLAG_OPTIMIZER_STEP
                st.since_opt = 0
        if self._lead_optimizer is None:
            self._lead_optimizer = id(optimizer)
        if id(optimizer) != self._lead_optimizer or self._loader_steps:
            return  # with DataLoader steps, optimizer rows would only cost time and memory
        t = self.clock()
        start = self._opt_prev or self.t0
        total = self._wait_total
        rec.steps.append(
            start - self.t0,
            t - start,
            total - self._opt_wait_mark,
            self._last_batch,
            SOURCE_OPTIMIZER,
            0,
        )
        self._opt_prev = t
        self._opt_wait_mark = total

    # --- markers --------------------------------------------------------------------------
    def marker(self) -> None:
        """An explicit end-of-step marker."""
        t = self.clock()
        start = self._marker_prev or self.t0
        total = self._wait_total
        self.record.markers += 1
        self.record.steps.append(
            start - self.t0,
            t - start,
            total - self._marker_wait_mark,
            self._last_batch,
            SOURCE_MARKER,
            0,
        )
        self._marker_prev = t
        self._marker_wait_mark = total

    # --- end ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every open step as truncated and resolve the GPU events (one sync)."""
        t_end = self.clock()
        for st in self._states.values():
            if st.open_start >= 0:
                self._close(st, t_end, FLAG_TRUNCATED, None)
            st.sampler_ref = None
        self._current = None
        if self.gpu is not None:
            self.gpu.finish()
