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

The instrumented calls only log what happened, as one tuple each, in order (the hot path:
between a model's backward and forward everything that only we run is cold in the caches,
so it must be little). Once a loader has closed a step, an optimizer step only appends
:data:`_OPT` to the log, through :attr:`StepTracer.step_counter`, a C-level callable (no Python
frame: see :mod:`.patches`). A fetch from the iterator fetched last, in the middle of its epoch,
logs only ``(iterator, t_enter, t_exit)``: the processing knows its loader and batch number from
that iterator's previous fetch (see :meth:`StepTracer.wrap_next`, whose statements run inside
torch's own ``__next__``, recompiled: no call of ours per fetch). The log is turned into step
rows in batches, and when the run ends.
Who does it: with a reader attached (:meth:`StepTracer.attach_reader`: the live view, which
processes the log on its own thread just before each of its reads), the reader; the training
thread then only logs, and processes only if the reader falls behind. Without one, the
training thread, in batches: the common fetch checks nothing, and the others (an iterator's
first fetch, one in every :data:`CHECK_EVERY`, another loader's) process the log once it holds
:data:`PROCESS_EVENTS` events or :data:`PROCESS_EVERY_NS` have passed, so the processing runs
warm, many events at a time, and a slow loop pays its cold start at most once every
:data:`CHECK_EVERY` steps. Whoever reads the rows during the run attaches as a reader, or calls
``Run.process_steps()`` first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
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
from .recompile import Statements, calling, recompiled

#: Without a reader, the event log is turned into step rows at the next check once it holds this
#: many events (an iterator's first fetch and one in :data:`CHECK_EVERY` are checks; a fast loop
#: then pauses briefly, warm, about every 256 steps of two events each: the fetch and the
#: optimizer step)...
PROCESS_EVENTS = 256
#: ...or once this long has passed since the last time, ns.
PROCESS_EVERY_NS = 500_000_000
#: With a reader attached, the training thread processes the log only once it holds this many
#: events (a reader that fell behind; about 1 MB of log)...
READER_MAX_EVENTS = 8192
#: ...or this long after the last processing (a reader that stopped reading), ns.
READER_EVERY_NS = 5_000_000_000

# Events of the log. A fetch, in general: (sampler, num_yielded after it, t_enter, t_exit, batch
# size, iterator, CUDA event at enter, at exit), the events None off CUDA; the exhausting fetch
# has num_yielded _END. The common fetch (see StepTracer.wrap_next): (iterator, t_enter, t_exit)
# when its batch size is counted, (iterator, t_enter, t_exit, batch size) when it is read; its
# loader and batch number follow from the iterator's previous fetch. An optimizer step, while
# the steps may still be optimizer steps: (_OPTIMIZER, id(optimizer), clock); once a loader has
# closed a step, _OPT, which is None (its place in the log is all that matters, and None is
# always in the caches: appending a sentinel of our own writes its cold reference count).
# A marker: (_MARKER, clock). Before the first fetch of an epoch: (_EPOCH, sampler, samples in
# the epoch, -1 unknown), for the counted batch sizes.
_END = -1
_COUNTED = -2  # batch size of a fetch: to be counted by processing (_LoaderState.counted_batch)
_EPOCH = object()
_OPTIMIZER = object()
_OPT = None
_MARKER = object()
#: The hot path checks the log's length (and whether processing is due) at an iterator's first
#: fetch and then at one fetch in this many; the ones between check nothing.
CHECK_EVERY = 256

#: The hot path, off CUDA: what :meth:`StepTracer.wrap_next` puts into ``__next__``. Its names
#: are parameters of the copy with the tracer's objects as defaults; ``_traceml_value`` is the
#: batch being returned. The common fetch reads no attribute of the iterator: a specialised read
#: of one is guarded by the iterator type's version, which changes whenever a DataLoader class is
#: modified (and costs a cache miss after a model's step).
_FETCH_STATEMENTS = Statements(
    entry="_traceml_enter = _traceml_clock()",
    on_return="""
        _traceml_exit = _traceml_clock()
        _traceml_left = _traceml_t._fast_left
        if {self} is _traceml_t._fast_it and _traceml_left > 0:
            _traceml_t._fast_left = _traceml_left - 1
            if _traceml_t._counted:
                _traceml_append(({self}, _traceml_enter, _traceml_exit))
            else:
                _traceml_append(
                    ({self}, _traceml_enter, _traceml_exit, _traceml_size(_traceml_value))
                )
        else:
            _traceml_t._log_fetch(
                {self}, _traceml_value, _traceml_enter, _traceml_exit, None, None
            )
        return _traceml_value
    """,
    on_stop="_traceml_t._log_end({self}, _traceml_enter, None)",
)


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
        "counted_batch",
        "epoch_samples",
    )

    def __init__(
        self, slot: int, info: LoaderInfo, sampler_ref: Any, counted_batch: int = 0
    ) -> None:
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
        #: > 0: batch sizes are counted (see :func:`counted_batch_size`), not read from batches
        self.counted_batch = counted_batch
        self.epoch_samples = -1  # samples in the current epoch (an _EPOCH event), -1 unknown


def epoch_samples(batch_sampler: Any) -> int:
    """Samples a ``BatchSampler`` will batch in the epoch it has just started, -1 unknown."""
    try:
        return len(batch_sampler.sampler)
    except Exception:
        return -1


def counted_batch_size(it: Any) -> int:
    """The batch size when a loader's batch sizes can be counted instead of read, else 0.

    They can when torch's own ``BatchSampler`` feeds a map-style dataset through the default
    collate: that collate stacks exactly one sample per index, so batch k (from 0) of an epoch
    of n samples holds ``min(batch_size, n - k * batch_size)`` samples, n being ``len()`` of
    the sampler the ``BatchSampler`` batches (as ``len(loader)`` assumes too). Counting costs
    the hot path nothing; reading ``batch[0].shape[0]`` costs up to a few microseconds when
    the model's step has evicted the batch from the caches. A custom collate, a custom batch
    sampler or an iterable dataset can yield other sizes: their batches are read.
    """
    try:
        from torch.utils.data import BatchSampler, default_collate
    except Exception:
        return 0
    sampler = getattr(it, "_index_sampler", None)
    if (
        type(sampler) is not BatchSampler
        or getattr(it, "_dataset_kind", None) != 0  # torch's _DatasetKind.Map
        or not getattr(it, "_auto_collation", False)
        or getattr(it, "_collate_fn", None) is not default_collate
    ):
        return 0
    size = getattr(sampler, "batch_size", None)
    if epoch_samples(sampler) < 0:
        return 0
    return size if type(size) is int and size > 0 else 0


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


def _standing_in_for(original: Callable[[Any], Any], wrapper: Callable[[Any], Any]) -> Any:
    """``wrapper``, named and documented as the ``original`` it wraps."""
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__name__ = "__next__"
    wrapper.__qualname__ = getattr(original, "__qualname__", "__next__")
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


class StepTracer:
    """Receives the instrumented events of one run and writes step rows into its record."""

    # The hot path's fields first: slots are laid out in this order, so they share a cache
    # line (between a model's backward and forward every line we touch is cold).
    __slots__ = (
        "_fast_it",
        "_fast_left",
        "_counted",
        "active",
        "_last_sampler",
        "_log",
        "_due",
        "_loader_steps",
        "clock",
        "gpu",
        "step_counter",
        "_max_log",
        "record",
        "t0",
        "processing_ns",
        "reader_processing_ns",
        "error",
        "_every_ns",
        "_lock",
        "_states",
        "_iterators",
        "_current",
        "_lead_optimizer",
        "_opt_prev",
        "_opt_wait_mark",
        "_marker_prev",
        "_marker_wait_mark",
        "_wait_total",
        "_last_batch",
        "_write",
        "_rows",
        "on_stop",
    )

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
        self.active = True  #: False once closed: wrappers from :meth:`wrap_next` call through
        #: time the logging threads (the training loop) spent turning the log into rows, ns
        self.processing_ns = 0
        #: ...and the time a reader spent on it (:meth:`process`, on the reader's thread), ns
        self.reader_processing_ns = 0
        #: why the tracer stopped during the run (its processing failed), else None
        self.error: str | None = None
        #: events not processed yet, in order (always this list: the wrappers hold it)
        self._log: list[Any] = []
        self._max_log = PROCESS_EVENTS  # the logging thread processes the log at this length
        self._every_ns = PROCESS_EVERY_NS  # ...or this long after the last time (at a check)
        self._lock = threading.Lock()
        self._due = 0  # clock value from which the next event processes the log
        self._last_sampler: Any = None  # the sampler of the loader fetched last
        self._counted = False  # ...whose batch sizes are counted, not read (hot path)
        #: the iterator whose next fetches are common ones (hot path), None when there is none
        self._fast_it: Any = None
        self._fast_left = 0  # ...and how many more of them may be, before a check (hot path)
        #: id(iterator) -> [its loader's state, its num_yielded at its last fetch processed]
        self._iterators: dict[int, list[Any]] = {}
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
        #: once :attr:`_loader_steps`, what an optimizer step has to call: it appends ``_OPT``
        #: to the log, in C (``functools.partial`` of ``list.append``)
        self.step_counter = partial(self._log.append, _OPT)
        #: called once if the tracer stops on an error (:mod:`.patches` stops the counters)
        self.on_stop: Callable[[], None] | None = None
        self._write = record.steps.packed_writer()
        self._rows: list[int] = []  # packed rows made by process(), written at its end

    # --- the hot path: log the event ------------------------------------------------------
    def wrap_next(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A ``__next__`` that runs ``original`` and logs the fetch. The hot path.

        It reads two clocks and appends one tuple to the log; the step bookkeeping happens
        later, in :meth:`process`. The common fetch is the next one from the iterator fetched
        last (:attr:`_fast_it`), when its loader is registered and no check is due: it logs
        ``(iterator, t_enter, t_exit)`` (and the batch size, read from the batch, unless it can
        be counted later: see :func:`counted_batch_size`), and reads nothing from the
        iterator. Every other fetch goes through :meth:`_log_fetch`: an iterator's
        first, another loader's, one in every :data:`CHECK_EVERY` (the log's length is
        checked), every fetch of a loader with persistent workers (an iterator that starts
        its epochs over) and, on CUDA, every fetch (the wrapper also records a CUDA event at
        enter and exit). Once the tracer is no longer :attr:`active` the wrapper only calls
        through and drops what it timed, so it stays harmless if something else was stacked
        on top of it and keeps calling it.

        Off CUDA this is not a wrapper but ``original`` itself, recompiled with
        :data:`_FETCH_STATEMENTS` inside it (:func:`.recompile.recompiled`: torch's code, file
        and line numbers, and no Python call of ours per fetch); where ``original`` cannot be
        recompiled exactly, the same statements around a call of it
        (:func:`.recompile.calling`).
        """
        tracer = self
        clock = self.clock
        if self.gpu is None:
            # What the common fetch needs comes in defaults (one tuple, where closure cells
            # would be four objects, each a cache miss once the model's step has evicted them).
            names = {
                "_traceml_t": tracer,
                "_traceml_clock": clock,
                "_traceml_append": self._log.append,
                "_traceml_size": batch_size_of,
            }
            fetch = recompiled(original, names, _FETCH_STATEMENTS)
            if fetch is None:
                fetch = calling(original, names, _FETCH_STATEMENTS)
            return _standing_in_for(original, fetch)
        timer = self.gpu

        # On CUDA every fetch takes the general path (_log_fetch) anyway.
        def __next__on_cuda(it: Any) -> Any:
            t = tracer
            if not t.active:
                return original(it)
            t_enter = clock()
            ev_enter = timer.mark()
            try:
                batch = original(it)
            except StopIteration:
                t._log_end(it, t_enter, ev_enter)
                raise
            t_exit = clock()
            ev_exit = timer.mark()
            t._log_fetch(it, batch, t_enter, t_exit, ev_enter, ev_exit)
            return batch

        return _standing_in_for(original, __next__on_cuda)

    def _log_fetch(
        self, it: Any, batch: Any, t_enter: int, t_exit: int, ev_enter: Any, ev_exit: Any
    ) -> None:
        """Log a fetch that is not the common one (see :meth:`wrap_next`), and say whether the
        iterator's next fetches can be common ones."""
        if not self.active:
            return
        sampler = it._index_sampler
        yielded = it._num_yielded
        if sampler is not self._last_sampler:
            self._see_loader(it, sampler)
        log = self._log
        if yielded == 1:  # read now: a sampler's length may change between epochs
            log.append((_EPOCH, sampler, epoch_samples(sampler)))
        size = _COUNTED if self._counted else batch_size_of(batch)
        log.append((sampler, yielded, t_enter, t_exit, size, it, ev_enter, ev_exit))
        # An iterator that starts its epochs over (persistent workers) would start one
        # unseen; a loader past MAX_LOADERS is not followed.
        if (
            ev_enter is None
            and self._last_sampler is sampler
            and id(sampler) in self._states
            and not getattr(it, "_persistent_workers", False)
        ):
            self._fast_it = it
            self._fast_left = CHECK_EVERY - 1
        else:
            self._fast_it = None
        if len(log) >= self._max_log or t_exit >= self._due:
            self._process_due()

    def _log_end(self, it: Any, t_enter: int, ev_enter: Any) -> None:
        """Log the exhausting fetch (``StopIteration``): it closes the epoch's last step."""
        if not self.active:
            return
        if it is self._fast_it:
            self._fast_it = None
        sampler = it._index_sampler
        if sampler is not self._last_sampler:
            self._see_loader(it, sampler)
        self._log.append((sampler, _END, t_enter, t_enter, 0, it, ev_enter, None))

    def optimizer_step(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        """An optimizer step (a global optimizer post-step hook has this signature). Once a
        loader has closed a step only its place in the log matters (what
        :attr:`step_counter` logs, without this Python call); before, it is logged with its
        time, for the optimizer rows."""
        if self._loader_steps:
            if self.active:
                self._log.append(_OPT)
            return
        t = self.clock()
        log = self._log
        log.append((_OPTIMIZER, id(optimizer), t))
        if len(log) >= self._max_log or t >= self._due:
            self._process_due()

    def deactivate(self) -> None:
        """Log nothing more: the wrappers call through, optimizer steps and markers are
        ignored (the C counter, if installed, is for :mod:`.patches` to take back)."""
        self.active = False
        self._fast_it = None

    @property
    def counts_optimizer_steps_in_c(self) -> bool:
        """True once optimizer steps need only :attr:`step_counter` (a loader closed a step)."""
        return self._loader_steps and self.active

    def marker(self) -> None:
        """An explicit end-of-step marker."""
        if not self.active:
            return
        t = self.clock()
        log = self._log
        log.append((_MARKER, t))
        if len(log) >= self._max_log or t >= self._due:
            self._process_due()

    def _see_loader(self, it: Any, sampler: Any) -> None:
        """A fetch from another loader than the last: register it if it is new (its settings
        are read from the iterator now, while it is at hand)."""
        self._last_sampler = sampler
        st = self._states.get(id(sampler))
        if st is None:
            st = self._new_loader(it, sampler)
        self._counted = st is not None and st.counted_batch > 0

    def _new_loader(self, it: Any, sampler: Any) -> _LoaderState | None:
        slot = len(self.record.loaders)
        if slot >= MAX_LOADERS:
            return None  # too many loaders: count nothing rather than mislabel
        st = _LoaderState(
            slot, loader_info_from_iterator(slot, it), sampler, counted_batch_size(it)
        )
        with self._lock:  # a reader's processing iterates the states
            self.record.loaders.append(st.info)
            self._states[id(sampler)] = st
        return st

    # --- the log into step rows -----------------------------------------------------------
    def attach_reader(self, attached: bool = True) -> None:
        """A thread that reads the step rows while the run goes on (the live view) will call
        :meth:`process` before each read: the training thread then only logs events, and
        processes them itself only past :data:`READER_MAX_EVENTS` events or
        :data:`READER_EVERY_NS` (a reader that fell behind or stopped). ``False`` when the
        reader stops: the training thread takes the processing back."""
        if attached:
            self._max_log, self._every_ns = READER_MAX_EVENTS, READER_EVERY_NS
        else:
            self._max_log, self._every_ns = PROCESS_EVENTS, PROCESS_EVERY_NS
        self._due = self.clock() + self._every_ns

    def process(self) -> None:
        """Turn the events logged so far into step rows, now; a reader calls it before reading
        the rows. Thread-safe; its time counts in :attr:`reader_processing_ns`. A failure stops
        the tracer (:meth:`stop_on_error`) rather than the reader."""
        self.reader_processing_ns += self._process_safely()

    def _process_due(self) -> None:
        """The logging thread's processing (the log is long, or it is time)."""
        self.processing_ns += self._process_safely()

    def _process_safely(self) -> int:
        """Process the log under the lock and return the time it took, ns. A failure of ours
        must not stop the user's loop or the reader: the tracer stops instead, and says why
        (:attr:`error`)."""
        t0 = self.clock()
        try:
            with self._lock:
                self._process_log()
        except Exception as exc:
            self.stop_on_error(exc)
        return self.clock() - t0

    def stop_on_error(self, exc: Exception) -> None:
        """Stop tracing for the rest of the run because ``exc`` broke the processing: the
        wrapper calls through, optimizer steps are ignored (:attr:`on_stop` takes the C counter
        back), markers are ignored, the log is dropped."""
        self.error = f"{type(exc).__name__}: {exc}"
        self.deactivate()
        self._loader_steps = True
        self._max_log = self._due = 1 << 62
        on_stop, self.on_stop = self.on_stop, None
        if on_stop is not None:
            try:
                on_stop()  # no more optimizer steps logged
            except Exception:
                pass
        self._log.clear()

    def _process_log(self) -> None:
        """Turn the logged events into step rows; the caller holds the lock, which keeps the
        events in order when a loader is iterated in another thread, or a reader processes.
        If it is interrupted (Ctrl-C arrives while it runs), the events it had not reached go
        back to the front of the log, for :meth:`close` to process."""
        log = self._log
        n = len(log)
        events = log[:n]
        del log[:n]  # what another thread appended meanwhile stays, in order
        self._due = self.clock() + self._every_ns
        pending = iter(events)
        iterators = self._iterators
        rows = self._rows
        t0 = self.t0
        # With one loader (the usual loop) an optimizer step marks the current step, and a
        # common fetch with a counted size that follows one of the current loader's closes its
        # open step: both are written out here, the rest goes through the general methods.
        single = len(self._states) == 1  # loaders are registered under the lock we hold
        steps = 0  # optimizer steps seen with a single loader, added to the record at the end
        try:
            for ev in pending:
                if ev is _OPT:
                    cur = self._current
                    if single and cur is not None:
                        steps += 1
                        cur.info.optimizer_steps += 1
                        cur.open_meta |= FLAG_OPTIMIZER_STEP
                        cur.since_opt = 0
                    else:
                        self._optimizer_steps(1)
                    continue
                kind = ev[0]
                if len(ev) == 3 and kind is not _OPTIMIZER and kind is not _EPOCH:
                    last = iterators.get(id(kind))  # a common fetch with a counted size
                    if last is None:
                        continue
                    owner: _LoaderState = last[0]
                    yielded = last[1] = last[1] + 1
                    start = owner.open_start
                    if owner is not self._current or start < 0:
                        self._fetch_event(owner, yielded, ev[1], ev[2], _COUNTED, None, None)
                        continue
                    t_enter = ev[1]
                    rows += (
                        start - t0,
                        t_enter - start,
                        owner.open_wait,
                        (owner.open_batch << 16) | owner.open_meta,
                    )
                    per = owner.counted_batch
                    left = owner.epoch_samples - (yielded - 1) * per
                    size = per if 0 < per <= left else left if 0 < left < per else -1
                    wait = ev[2] - t_enter
                    owner.info.fetches += 1
                    owner.since_opt += 1
                    owner.open_start = t_enter
                    owner.open_wait = wait
                    owner.open_batch = size
                    owner.open_meta = owner.slot_meta
                    self._wait_total += wait
                    self._last_batch = size
                    self._loader_steps = True
                elif kind is _OPTIMIZER:
                    self._optimizer_event(ev[1], ev[2])
                elif kind is _MARKER:
                    self._marker_event(ev[1])
                elif kind is _EPOCH:
                    st = self._states.get(id(ev[1]))
                    if st is not None:
                        st.epoch_samples = ev[2]
                elif len(ev) == 4:  # a common fetch with a size read from the batch
                    last = iterators.get(id(kind))
                    if last is not None:
                        yielded = last[1] = last[1] + 1
                        self._fetch_event(last[0], yielded, ev[1], ev[2], ev[3], None, None)
                else:
                    sampler, yielded, t_enter, t_exit, size, it, ev_enter, ev_exit = ev
                    st = self._states.get(id(sampler))
                    if st is None:
                        continue  # a loader past MAX_LOADERS
                    if yielded == _END:
                        iterators.pop(id(it), None)
                    else:
                        iterators[id(it)] = [st, yielded]
                    self._fetch_event(st, yielded, t_enter, t_exit, size, ev_enter, ev_exit)
        except BaseException:
            log[:0] = list(pending)
            raise
        finally:
            self.record.optimizer_steps += steps
            self._flush_rows()

    def _flush_rows(self) -> None:
        """Write the rows collected so far, in one ``extend`` (before any other row)."""
        if self._rows:
            self._write(self._rows)
            self._rows.clear()

    def _fetch_event(
        self,
        st: _LoaderState,
        yielded: int,
        t_enter: int,
        t_exit: int,
        size: int,
        ev_enter: Any,
        ev_exit: Any,
    ) -> None:
        """One fetch of ``st``'s loader: close its previous step and open the next."""
        start = st.open_start
        if start >= 0:  # close this loader's previous step
            if ev_enter is None:
                self._rows += (
                    start - self.t0,
                    t_enter - start,
                    st.open_wait,
                    (st.open_batch << 16) | st.open_meta,
                )
            else:
                self._close(st, t_enter, 0, ev_enter)
            st.open_start = -1
            if yielded != _END:
                self._loader_steps = True
        if yielded == _END:
            return
        if size == _COUNTED:  # batch number `yielded` of the epoch: min(batch size, what is left)
            per = st.counted_batch  # 0 for a loader whose sizes are read (a race between
            left = st.epoch_samples - (yielded - 1) * per  # two loading threads): unknown
            size = per if 0 < per <= left else left if 0 < left < per else -1
        wait = t_exit - t_enter
        if self._current is not st:
            self._switch_to(st, wait)
        st.since_opt += 1
        info = st.info
        info.fetches += 1
        first = yielded == 1
        if first:
            info.epochs += 1
            if info.fetches == 1:
                self.record.first_fetch_wait_ns[st.slot] = wait
        st.open_start = t_enter
        st.open_wait = wait
        st.open_batch = size
        st.open_meta = st.slot_meta | FLAG_EPOCH_START if first else st.slot_meta
        st.ev_enter = ev_enter
        st.ev_exit = ev_exit
        self._wait_total += wait
        self._last_batch = size

    def _switch_to(self, st: _LoaderState, wait: int) -> None:
        """Another loader than the last one: mark the steps it interrupts, share its wait."""
        self._current = st
        if len(self._states) > 1:
            for other in self._states.values():
                if other is not st and other.open_start >= 0:
                    other.open_meta |= FLAG_INTERLEAVED
                    other.open_wait += wait  # its step waited for this batch too

    def _close(self, st: _LoaderState, t_end: int, extra_flags: int, ev_next: Any) -> None:
        self._flush_rows()
        start = st.open_start
        meta = st.open_meta | extra_flags
        row = self.record.steps.append(
            start - self.t0, t_end - start, st.open_wait, st.open_batch, meta >> 8, meta & 0xFF
        )
        if self.gpu is not None and ev_next is not None and st.ev_enter is not None:
            self.gpu.add(row, st.ev_enter, st.ev_exit, ev_next)
        st.open_start = -1
        st.ev_enter = st.ev_exit = None

    def _optimizer_steps(self, n: int) -> None:
        """``n`` optimizer steps, all after the same fetch: count them and mark the loaders."""
        self.record.optimizer_steps += n
        cur = self._current
        if cur is None:
            return
        if len(self._states) == 1:  # the usual single loader: no other loader to mark
            cur.info.optimizer_steps += n
            cur.open_meta |= FLAG_OPTIMIZER_STEP
            cur.since_opt = 0
            return
        # The loader fetched last is a training loader, and so is any other loader fetched
        # alongside it in this step (``zip(a, b)``), but not an eval loop that ran since the
        # last optimizer step (more batches than the training loader's).
        for st in self._states.values():
            if st is cur:
                st.info.optimizer_steps += n
                st.open_meta |= FLAG_OPTIMIZER_STEP
            elif 0 < st.since_opt <= cur.since_opt and st.open_start >= 0:
                st.info.optimizer_steps += 1  # the later ones came without a new fetch
                st.open_meta |= FLAG_OPTIMIZER_STEP
            st.since_opt = 0

    def _optimizer_event(self, optimizer_id: int, t: int) -> None:
        self._optimizer_steps(1)
        rec = self.record
        if self._lead_optimizer is None:
            self._lead_optimizer = optimizer_id
        if optimizer_id != self._lead_optimizer or self._loader_steps:
            return  # with DataLoader steps, optimizer rows would only cost time and memory
        self._flush_rows()
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

    def _marker_event(self, t: int) -> None:
        self._flush_rows()
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
        """Process the log, close every open step as truncated and resolve the GPU events
        (one sync); after an :attr:`error`, only let go of the loaders. A reader may still call
        :meth:`process` afterwards: it finds nothing."""
        self.deactivate()
        t_end = self.clock()
        with self._lock:
            try:
                if self.error is None:
                    self._finish(t_end)
            finally:
                for st in self._states.values():
                    st.sampler_ref = None  # the sampler holds the dataset
                self._current = None
                self._last_sampler = None
                self._iterators.clear()

    def _finish(self, t_end: int) -> None:
        t0 = self.clock()
        self._process_log()
        self.processing_ns += self.clock() - t0
        for st in self._states.values():
            if st.open_start >= 0:
                self._close(st, t_end, FLAG_TRUNCATED, None)
        if self.gpu is not None:
            self.gpu.finish()
