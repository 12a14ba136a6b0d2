"""The training thread's side of a run: log each fetch, optimizer step and marker, and have the
log turned into step rows (:class:`~traceml_nb.engine.segment.StepSegmenter`) in batches.

The hot path, a fetch, reads two clocks and the iterator's batch count and appends one tuple
(:mod:`traceml_nb.engine.events`) to the log, with the shape of the batch's first tensor where
its size cannot be counted (:func:`~.loader.counted_batch_size`); an optimizer step appends one
more. On CUDA a fetch also
records two pooled CUDA events (:mod:`.gpu_events`).
Everything else happens later, many events at a time, on whichever thread processes the log:
the segmenter writes the rows, and has the tracer announce each iterator new to the run or
starting an epoch over, with its loader's settings. Who processes:

* with a reader attached (:meth:`StepTracer.attach_reader`: the live view, which asks for fresh
  rows before each of its updates), the reader's thread; the training thread only past
  :data:`READER_MAX_EVENTS` events (a reader that fell behind or stopped);
* without one, the training thread, once the log holds :data:`PROCESS_EVENTS` events, at an
  iterator's first batch of an epoch and every :data:`CHECK_EVERY`-th (torch's ``__next__``
  counts an iterator's batches; an optimizer step, every :data:`CHECK_EVERY`-th, or a marker
  checks only against :data:`READER_MAX_EVENTS`, the log's bound);
* the run's end processes the rest and closes what is still open.

A failure of our own bookkeeping stops the tracing for the rest of the run (the steps before it
are kept, :attr:`StepTracer.error` says why), never the user's loop.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence, Set
from typing import Any, Protocol, TypeVar

from ..events import EPOCH_STARTED, EXHAUSTED, FETCH, MARKER, OPTIMIZER_STEP, IteratorStarted
from ..record import LoaderInfo, RunRecord
from ..segment import StepSegmenter
from .gpu_events import GpuStallTimer
from .loader import batch_shape_of, counted_batch_size, driver_of, epoch_samples, loader_settings

#: Without a reader, the training thread processes the log once it holds this many events...
PROCESS_EVENTS = 256
#: ...looked at every this many batches of an iterator (a power of two: the check is a mask of
#: the iterator's own batch count, which costs the fetch nothing).
CHECK_EVERY = 256
#: With a reader attached, the training thread processes the log only once it holds this many
#: events (a reader that fell behind or stopped); without one, an optimizer step or a marker
#: processes it at this length too (a loop without a DataLoader: looked at every
#: ``CHECK_EVERY`` optimizer steps). About 1 MB of log.
READER_MAX_EVENTS = 8192
#: The log names the iterators and optimizers of its events until it is processed, so an
#: iterator the loop left by a ``break`` (and its worker processes), or a sweep's earlier model
#: and optimizer, would live on until then. An iterator that begins its epoch processes the log
#: once it holds this many events, and always when the iterator has workers (starting them took
#: milliseconds; processing takes microseconds): at most an epoch's worth stays named. The
#: first step of an optimizer other than the last two processes it too (a sweep's next trial,
#: with or without a loader; a GAN's two optimizers in turn do not). With a reader attached
#: (the live view's thread processes the log at its own pace) only the workers' case does.
EPOCH_PROCESS_EVENTS = 32

T = TypeVar("T")
#: A global optimizer post-step hook: called with ``(optimizer, args, kwargs)``.
OptimizerHook = Callable[[Any, Any, Any], None]


class StepEndListener(Protocol):
    """Told of an optimizer step's end by the tracer's hook once its ``countdown`` (optimizer
    steps) runs out; it sets the countdown again. The hook counts down to the least of its
    listeners' countdowns and only then brings each down by the steps since, so a listener
    sets its countdown when told, or raises it, and never lowers it in between."""

    countdown: int

    def optimizer_step_ended(self, optimizer: Any) -> None: ...


class WorkerPids:
    """The process ids of the DataLoader workers a run's host sampler counts: once the log
    shows a loader training (an optimizer step credited to it), the workers of the loaders
    that trained; before, those of the loaders whose epoch began with autograd on where there
    are any, else every loader's (an evaluation or inference alone). An evaluation's workers
    beside training ones (persistent, idle while the model trains) would halve the workers'
    CPU each; the transformers ``Trainer`` iterates its evaluation loader with autograd on.
    Added to on the training thread (:meth:`add`) and where the log is processed
    (:meth:`of_loader`, :meth:`loaders_trained`), only looked up (``in``) elsewhere."""

    def __init__(self) -> None:
        self.training: set[int] = set()
        self.evaluating: set[int] = set()
        #: the workers of the loaders that trained, as of the log's last processing
        self.trained: frozenset[int] = frozenset()
        #: loader key -> (its settings, which count its optimizer steps; its workers)
        self._by_loader: dict[int, tuple[LoaderInfo, set[int]]] = {}
        #: the run launched ranks: this process's children are theirs (and their workers),
        #: and every one counts (the CPU chart's line becomes the ranks')
        self.every_child = False

    def add(self, pids: list[int], grad: bool) -> None:
        (self.training if grad else self.evaluating).update(pids)

    def of_loader(self, key: int, info: LoaderInfo | None, pids: list[int]) -> None:
        """``pids`` are workers of the loader ``key`` (``info``: its settings, the first time
        it is met)."""
        entry = self._by_loader.get(key)
        if entry is None:
            if info is None:
                return
            entry = self._by_loader[key] = (info, set())
        entry[1].update(pids)

    def loaders_trained(self) -> None:
        """Take the workers of the loaders that trained as of now (the log just processed)."""
        trained = {
            p for info, pids in self._by_loader.values() if info.optimizer_steps for p in pids
        }
        if trained != self.trained:
            self.trained = frozenset(trained)

    def _counted(self) -> Set[int]:
        return self.trained or self.training or self.evaluating

    def __contains__(self, pid: object) -> bool:
        return self.every_child or pid in self._counted()

    def __len__(self) -> int:
        return len(self._counted())


def _itself(obj: T) -> T:
    return obj


def _nothing() -> None:
    return None


class StepTracer:
    """Receives the instrumented events of one run and has them segmented into its record."""

    def __init__(
        self,
        record: RunRecord,
        gpu: GpuStallTimer | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.record = record
        self.gpu = gpu
        self.clock = clock
        #: False once the run has ended or the tracing stopped: the log is dropped from then on
        self.active = True
        #: why the tracing stopped during the run (a failure of ours), else None
        self.error: str | None = None
        #: logged tuples not processed yet, in order (always this list: the wrapper holds it)
        self.log: list[tuple[Any, ...]] = []
        #: the log length at which the logging thread processes it
        self.max_log = PROCESS_EVENTS
        #: a reader (the live view's thread) processes the log: the training thread only logs
        self.reader_attached = False
        #: held while the log is processed; a reader holds it to read rows and loaders alike
        self.lock = threading.Lock()
        #: time the logging threads (the training loop) spent processing, ns
        self.processing_ns = 0
        #: ...and the time readers spent on it, on their own threads, ns
        self.reader_processing_ns = 0
        #: called once if the tracing stops on an error (the hooks take the optimizer hook back)
        self.on_stop: Callable[[], None] | None = None
        #: called as each epoch begins (the hooks wrap an optimizer imported since)
        self.on_epoch: Callable[[], None] | None = None
        #: the DataLoader workers' process ids, read as each epoch begins: the host sampler
        #: counts these children as workers, no others (a W&B service, a compile worker)
        self.worker_pids = WorkerPids()
        #: whether a model is in training mode (``EpochStarted.model_training``): the phase
        #: instruments' :meth:`~.step_phases.StepPhases.models_training` once in place
        self.models_training: Callable[[], bool | None] = _nothing
        self._segmenter = StepSegmenter(
            record, gpu.take if gpu is not None else None, announce=self._announce
        )
        #: ``(id(sampler), id(dataset))`` of each batch sampler and dataset met together ->
        #: (a reference to the sampler, one to the dataset or None, their loader key)
        self._loader_keys: dict[
            tuple[int, int], tuple[Callable[[], Any], Callable[[], Any] | None, int]
        ] = {}
        self._next_key = itertools.count()

    # --- the hot path ---------------------------------------------------------------------
    def wrap_next(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A ``__next__`` that calls ``original`` and logs the fetch."""
        from torch.utils.data import BatchSampler, default_collate

        tracer = self
        clock = self.clock
        append = self.log.append
        mark_enter = self.gpu.mark_enter if self.gpu is not None else None
        mark = self.gpu.mark if self.gpu is not None else None

        def __next__(it: Any) -> Any:
            __tracebackhide__ = True  # noqa: F841 (IPython and pytest hide this frame)
            t_enter = clock()
            gpu_enter = mark_enter(it) if mark_enter is not None else None
            try:
                batch = original(it)
            except StopIteration:
                append((EXHAUSTED, it, t_enter, gpu_enter))
                raise
            t_exit = clock()
            gpu_exit = mark() if mark is not None else None
            number = it._num_yielded
            if number == 1:
                tracer.epoch_started(it)
            if (  # counted_batch_size(it) > 0, read off the iterator as it is at hand
                type(it._index_sampler) is BatchSampler
                and it._collate_fn is default_collate
                and not it._dataset_kind
            ):
                shape = None  # the segmenter counts its samples
            else:
                shape = batch_shape_of(batch)
            append((FETCH, it, number, t_enter, t_exit, shape, gpu_enter, gpu_exit))
            if not number % CHECK_EVERY:
                tracer.check()
            return batch

        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        __next__.__qualname__ = getattr(original, "__qualname__", "__next__")
        __next__.__doc__ = getattr(original, "__doc__", None)
        return __next__

    def optimizer_hook(self, listeners: Sequence[StepEndListener] = ()) -> OptimizerHook:
        """A global optimizer post-step hook that logs each step; each of ``listeners`` (the
        phase instruments, the FLOP count) is told first when its countdown runs out (its
        ``look_soon()`` has the hook look at their countdowns at the next step). The
        listeners, and the log's length against :data:`READER_MAX_EVENTS`, are looked at only
        then, or every :data:`CHECK_EVERY` steps: the hook counts down on its own in between
        (after a step that evicted the caches, every object touched costs: the step's end took
        2.7 us less on the 2-core VM once it touched neither listener, and 0.75 us less once
        it no longer measured the log at every step, benchmarks/README.md)."""
        tracer = self
        clock = self.clock
        log = self.log
        append = log.append
        told = tuple(listeners)
        due = owed = 1  # steps until the next look (the least countdown runs out, or a check)
        # the optimizer that stepped last and the one before, held weakly: holding one would
        # hold its parameters, and an id() comes back as the next trial's optimizer's
        latest: Callable[[], Any] = _nothing
        before: Callable[[], Any] = _nothing

        def on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            nonlocal due, owed, latest, before
            due -= 1
            look = due <= 0
            if look:
                for listener in told:
                    listener.countdown -= owed
                    if listener.countdown <= 0:
                        listener.optimizer_step_ended(optimizer)
                due = owed = max(1, min([CHECK_EVERY, *(x.countdown for x in told)]))
            append((OPTIMIZER_STEP, optimizer, clock()))
            if optimizer is not latest():  # a GAN's other optimizer, or a new one
                if optimizer is not before() and tracer.active and not tracer.reader_attached:
                    tracer.processing_ns += tracer._process()  # a sweep's earlier trial goes
                before = latest
                try:
                    latest = weakref.ref(optimizer)
                except TypeError:  # no weak references: held, as the log holds it anyway
                    latest = functools.partial(_itself, optimizer)
            elif look and len(log) > READER_MAX_EVENTS:
                tracer.check()

        def look_soon() -> None:
            """Look at the listeners at the next step (a listener's countdown was cut short):
            the steps owed are those since the last look, the next one included."""
            nonlocal due, owed
            owed, due = owed - due + 1, 1

        on_optimizer_step.look_soon = look_soon  # type: ignore[attr-defined]
        return on_optimizer_step

    def epoch_started(self, it: Any) -> None:
        """``it`` yielded its epoch's first batch: log how many samples its sampler holds now
        (a sampler's length may change between epochs), what iterates it (a trainer's own
        loop: :func:`~.loader.driver_of`), whether autograd is on (off: an evaluation) and
        whether the models are in training mode; note its workers (:attr:`worker_pids`)."""
        import torch

        try:
            sampler = it._index_sampler
            samples = epoch_samples(sampler) if counted_batch_size(it) else -1
            driver = driver_of(sys._getframe(2))  # past this method and the wrapper
        except Exception:
            samples, driver = -1, None
        grad = torch.is_grad_enabled()
        try:
            self.worker_pids.add([w.pid for w in getattr(it, "_workers", ()) if w.pid], grad)
        except Exception:
            pass
        try:
            training = self.models_training()
        except Exception:  # a model whose attributes raise: its mode unknown
            training = None
        self.log.append((EPOCH_STARTED, it, samples, driver, grad, training))
        try:
            if self.on_epoch is not None:
                self.on_epoch()
        except Exception:
            pass
        workers = bool(getattr(it, "_num_workers", 0))
        due = not self.reader_attached and len(self.log) >= EPOCH_PROCESS_EVENTS
        if self.active and (workers or due):
            # what the log names lives no longer than an epoch (EPOCH_PROCESS_EVENTS)
            self.processing_ns += self._process()
        else:
            self.check()  # a loop that makes a new iterator for every few batches checks here

    def marker(self) -> None:
        """An explicit end of a step (``traceml_nb.step()``)."""
        log = self.log
        log.append((MARKER, self.clock()))
        if len(log) > READER_MAX_EVENTS:
            self.check()

    def check(self) -> None:
        """The logging thread's look at its log: process it when it is due; drop it once the
        tracing is over (a wrapper that stayed in place keeps logging into it)."""
        if not self.active:
            self.log.clear()
        elif len(self.log) >= self.max_log:
            self.processing_ns += self._process()

    def evaluated_since(self, t_ns: int) -> bool:
        """Whether a loader no optimizer step has followed (an evaluation's) was fetched since
        ``t_ns`` (:attr:`clock` ns). Processes the log first, on the calling thread (the
        training loop's: the FLOP count's end, once a run)."""
        self.processing_ns += self._process()
        return self._segmenter.away_fetch_ns >= t_ns

    # --- processing the log ---------------------------------------------------------------
    def attach_reader(self, attached: bool = True) -> None:
        """A thread that reads the rows while the run goes on calls :meth:`process` before each
        read; the training thread then only logs, up to :data:`READER_MAX_EVENTS` events
        (and the epoch's start of an iterator with workers: :data:`EPOCH_PROCESS_EVENTS`).
        ``False`` when the reader stops: the training thread takes the work back."""
        self.max_log = READER_MAX_EVENTS if attached else PROCESS_EVENTS
        self.reader_attached = attached

    def process(self) -> None:
        """Process the events logged so far, now (a reader, before it reads; its time counts in
        :attr:`reader_processing_ns`). A failure stops the tracing, not the reader."""
        self.reader_processing_ns += self._process()

    def read(self, reader: Callable[[], T]) -> T:
        """Process the events logged so far and return ``reader()``, both under :attr:`lock`,
        so that what it reads (rows, loaders, counters) is one consistent state. Its time
        counts in :attr:`reader_processing_ns`."""
        t0 = time.perf_counter_ns()
        try:
            with self.lock:
                try:
                    self._segment()
                except Exception as exc:
                    self.stop_on_error(exc)
                return reader()
        finally:
            self.reader_processing_ns += time.perf_counter_ns() - t0

    def _process(self) -> int:
        """Process the log; returns the time it took (real time, whatever :attr:`clock` is), ns."""
        t0 = time.perf_counter_ns()
        try:
            with self.lock:
                self._segment()
        except Exception as exc:
            self.stop_on_error(exc)
        return time.perf_counter_ns() - t0

    def _segment(self) -> None:
        """Hand the log to the segmenter (the caller holds :attr:`lock`). If it is interrupted
        (Ctrl-C while it runs on the training thread) the tuples it had not reached go back to
        the front of the log, for :meth:`close`."""
        if not self.active and self.error is not None:
            self.log.clear()
            return
        log = self.log
        n = len(log)
        logged = log[:n]
        del log[:n]  # what another thread appended meanwhile stays, in order
        pending = iter(logged)
        try:
            self._segmenter.feed(pending)
        except BaseException:
            log[:0] = list(pending)
            raise
        self.worker_pids.loaders_trained()

    def _announce(self, it: Any, starting: tuple[int, str | None] | None) -> IteratorStarted:
        """The segmenter meets a fetch of ``it`` new to the run or starting its epoch over;
        ``starting``: the ``(samples, driver)`` logged when its epoch started, None if it
        started before the run (its epoch is this one). With its loader's settings (and what
        iterates it) the first time that loader is seen."""
        if starting is None:
            samples = epoch_samples(it._index_sampler) if counted_batch_size(it) else -1
            driver = None
        else:
            samples, driver = starting
        loader, new = self._loader_key(it._index_sampler, getattr(it, "_dataset", None))
        settings = None
        if new:
            settings = loader_settings(it, driver)
        workers = [w.pid for w in getattr(it, "_workers", ()) if w.pid]
        if workers:
            self.worker_pids.of_loader(loader, settings, workers)
        return IteratorStarted.of(it, loader, settings, counted_batch_size(it), samples)

    def _loader_key(self, sampler: Any, dataset: Any) -> tuple[int, bool]:
        """The key of the loader whose batch sampler is ``sampler`` and whose dataset is
        ``dataset``, and whether it is new to the run (a DataLoader's sampler is its own; fastai's
        loaders share one, each the dataset of its iterators). Keys are never reused, and the
        sampler and dataset are held weakly where they can be: the user's code frees them when
        it drops the loader (a stage's, a sweep's), as without a run. One freed, its ``id()``
        may come back as another loader's: the references tell them apart (a sampler without
        weak references is held to the run's end; a dataset without them, a list, is told by
        its ``id()`` alone, its sampler holding it)."""
        ids = (id(sampler), id(dataset))
        known = self._loader_keys.get(ids)
        if (
            known is not None
            and known[0]() is sampler
            and (known[1] is None or known[1]() is dataset)
        ):
            return known[2], False
        key = next(self._next_key)
        try:
            ref: Callable[[], Any] = weakref.ref(sampler)
        except TypeError:
            ref = functools.partial(_itself, sampler)
        dataset_ref: Callable[[], Any] | None = None
        try:
            dataset_ref = weakref.ref(dataset)
        except TypeError:
            pass
        self._loader_keys[ids] = (ref, dataset_ref, key)
        return key, True

    def stop_on_error(self, exc: BaseException) -> None:
        """Stop tracing for the rest of the run because ``exc`` broke our bookkeeping: the
        optimizer hook is taken back (:attr:`on_stop`), the log is dropped from now on."""
        self.error = f"{type(exc).__name__}: {exc}"
        self.deactivate()
        self.max_log = 1 << 62
        self.log.clear()
        on_stop, self.on_stop = self.on_stop, None
        if on_stop is not None:
            try:
                on_stop()
            except Exception:
                pass

    def deactivate(self) -> None:
        """Log nothing more: what the wrapper still logs is dropped at its next check."""
        self.active = False

    # --- end ------------------------------------------------------------------------------
    def close(self, completed: bool = False) -> None:
        """Process the rest of the log, close every open step at the run's end (``completed``:
        the loop ended, not interrupted nor failed) and resolve the GPU events (the run's one
        synchronisation); after an :attr:`error`, only let go of the loaders. A reader may
        still call :meth:`process` afterwards: it finds nothing."""
        t_end = self.clock()
        t0 = time.perf_counter_ns()
        with self.lock:
            try:
                if self.error is None:
                    self._segment()
                    self._segmenter.finish(t_end, completed)
                    self.processing_ns += time.perf_counter_ns() - t0
                    if self.gpu is not None:
                        self.gpu.finish()
            finally:
                self.deactivate()
                self.log.clear()
                self._loader_keys.clear()  # a sampler held strongly holds its dataset
