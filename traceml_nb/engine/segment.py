"""Step segmentation: the events the instruments logged (:mod:`traceml_nb.engine.events`) into step rows.

Pure and torch-free: events in, rows and loader statistics written to the run record out.

* **A loader's steps.** Each DataLoader keeps its own steps, ``[entry of fetch k, entry of
  fetch k+1)``: the wait for batch k plus everything the loop did with it. The data wait of a
  step is the time inside ``__next__`` for its batch, plus the time inside any other loader's
  ``__next__`` while the step was open (loaders consumed together with ``zip(a, b)``, or a
  second loader drawn inside each step: its wait is part of the step's). The exhausting fetch
  (``StopIteration``) closes the epoch's last step; the end of the run closes the rest
  (``FLAG_TRUNCATED``), and so does a loader's next epoch where the loop left its iterator
  after two batches or more (a ``break`` out of each epoch: its last batch fetched and,
  before the break, trained on or not; not ``next(iter(loader))`` every step), or a new loader
  that goes on from its epochs (``LoaderInfo.follows``), or another training loader's epoch
  it was left for (:func:`~.open_steps.left_for`); a step closed so ends at its last
  optimizer step, if it had one, and is no row where its batch was never used (timed, and no
  model, backward or update ran on it).
* **Which loader trains.** An optimizer step is credited to the loader fetched last and to
  every loader fetched alongside it since the previous optimizer step (no more often than
  that one): their batches are followed by optimizer steps (``LoaderInfo.optimizer_steps``).
  The loader whose fetch comes first after an optimizer step begins the step
  (``LoaderInfo.leads``): the outer loop's loader, not one drawn inside the step.
  A loader whose epoch began with autograd off (``torch.no_grad()``: an evaluation, one batch
  of it or more) is credited none, nor one whose epochs begin now and then beside another
  loader's (``next(iter(val_loader))`` every few steps, autograd on):
  :func:`~.open_steps.credited_loaders`. A step inside which a loader that no optimizer step
  followed was iterated (an evaluation) is flagged ``FLAG_INTERLEAVED``. An epoch of a
  training loader begun with autograd on but the models in eval mode (``model.eval()``
  without ``torch.no_grad()``) that ends with no optimizer step is an evaluation's too, known
  only once it is over: its rows are noted then (``LoaderInfo.evaluation_rows``,
  :meth:`~.open_steps.LoaderSteps.epoch_over`), not flagged.
* **Optimizer rows.** The intervals between the lead optimizer's ``step()`` calls are rows of
  their own (:mod:`.optimizer_rows`): the steps of a loop without a DataLoader, of one that
  fetches its next batch before it uses the current one (``fetches_ahead``), or every batch of
  a gradient-accumulation cycle (``FETCH_ONLY_SHARE``). **Markers** (``traceml_nb.step()``)
  make rows of their own.
* **Phases.** A step begun while the phase instruments were on gets the phases they timed
  between its start and its end (:mod:`.phase_ledger`); the input copy runs from a fetch's
  return to the first forward after it.

Which of these rows are *the* steps of the run is one rule, :func:`traceml_nb.analysis.steps.choose_steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .events import (
    EPOCH_STARTED,
    EXHAUSTED,
    FETCH,
    ITERATOR_STARTED,
    MARKER,
    OPTIMIZER_STEP,
    PHASE,
    SAMPLING,
    Announcer,
    EpochStarted,
    Event,
    EventLike,
    Exhausted,
    Fetch,
    IteratorStarted,
    Marker,
    OptimizerStep,
)
from .marker_rows import MarkerRows
from .open_steps import (
    NONE,
    IteratorCount,
    LoaderSteps,
    batch_extent,
    credited_loaders,
    goes_on_from,
    left_for,
    optimizer_stepped,
)
from .optimizer_info import optimizer_info
from .optimizer_rows import OptimizerRows
from .phase_ledger import GpuSink, GpuStep, PhaseLedger
from .record import (
    FLAG_EPOCH_START,
    FLAG_EVALUATING,
    FLAG_INTERLEAVED,
    FLAG_OPTIMIZER_STEP,
    FLAG_TRUNCATED,
    MAX_LOADERS,
    LoaderInfo,
    RunRecord,
)
from .row_queue import RowQueue


class StepSegmenter:
    """Turns events into step rows of ``record`` (see the module docstring for the rules).

    Feed it the events in the order they were logged; :meth:`finish` closes what the run's end
    left open. Not thread-safe: its owner serialises the calls. An iterator is known from its
    :class:`~.events.IteratorStarted`; with an ``announce`` (:data:`Announcer`), a fetch of an
    iterator not known, or whose batch count fell, has it announced first.
    """

    def __init__(
        self,
        record: RunRecord,
        gpu_sink: GpuSink | None = None,
        announce: Announcer | None = None,
    ) -> None:
        self.record = record
        self._t0 = record.t0_ns
        self._gpu_sink = gpu_sink
        self._announce = announce
        self._loaders: dict[int, LoaderSteps] = {}  #: by loader key
        self._by_slot: dict[int, LoaderSteps] = {}
        self._iterators: dict[int, IteratorCount] = {}  #: by id() of the iterator
        #: by id() of an iterator: the EpochStarted fields logged for its next fetch
        self._starting: dict[int, tuple[int, str | None, bool, bool | None]] = {}
        self._open: dict[int, LoaderSteps] = {}  #: loaders with an open step, by slot
        self._current: LoaderSteps | None = None  #: the loader fetched last
        self._after_optimizer = True  #: the next fetch begins a step
        self._lead_optimizer: int | None = None
        self._optimizers_seen: set[int] = set()  #: ``id()`` of each optimizer recorded
        #: a loader the last optimizer step credited was fetched since the one before it
        self._step_before_fetched = True
        self._trained = False  #: an optimizer step has run
        self._phase: LoaderSteps | None = None  #: the loader whose phase runs (see ``phase_ns``)
        self._phase_start_ns = 0
        #: entry of the last fetch of a loader no optimizer step has followed (an evaluation's
        #: once training has begun), -1 before any
        self.away_fetch_ns = -1
        self._wait_total = 0  #: data wait of every fetch so far, ns
        self._phases = PhaseLedger()
        self._optimizer_rows = OptimizerRows(self._by_slot, self._phases, self._t0)
        self._markers = MarkerRows(self._phases, self._t0)
        self._last_batch = -1
        self._queue = RowQueue(record.steps)
        self._gpu: list[GpuStep] = []
        self._gpu_done: list[tuple[int, EventLike]] = []  #: CUDA events let go of, for the sink
        #: by event kind (an event's first item)
        self._handlers: dict[int, Callable[[Any], object]] = {
            FETCH: self._fetch,
            OPTIMIZER_STEP: self._optimizer_step,
            ITERATOR_STARTED: self._iterator_started,
            EPOCH_STARTED: self._epoch_started,
            EXHAUSTED: self._exhausted,
            MARKER: self._marker,
            PHASE: self._phases.phase,
            SAMPLING: self._phases.turned,
        }

    def feed(self, events: Iterable[Event | tuple[Any, ...]]) -> None:
        """Apply ``events`` in order: typed events, or the tuples the tracer logged. The rows
        made are written even if an event raises (the rest stay in ``events``, an iterator)."""
        handlers = self._handlers
        try:
            for event in events:
                handlers[event[0]](event)
        finally:
            self._flush()

    def finish(self, t_end_ns: int, completed: bool = False) -> None:
        """Close every open step at the run's end ``t_end_ns`` (``FLAG_TRUNCATED``). An epoch
        begun with the models in eval mode is over if its iterator was exhausted, or if the run
        ``completed`` (the loop ended: a ``break`` left it; an interrupted one may have been
        training)."""
        self._end_phase(t_end_ns)
        try:
            for st in list(self._open.values()):
                self._close(st, t_end_ns, None, truncated=True)
            end_row = self._queue.next_index
            for st in self._by_slot.values():
                if st.epoch is not None and (completed or st.epoch.exhausted):
                    st.epoch_over(end_row)
                st.epoch_left()
                st.tell_rows_apart()
            self._fetched_again()
        finally:
            self._flush()

    # --- events ------------------------------------------------------------------------------
    def _iterator_started(self, ev: IteratorStarted) -> IteratorCount:
        _, iterator, loader, settings, batch_size, samples = ev
        st = self._loaders.get(loader)
        if st is None:
            slot = len(self.record.loaders)
            if settings is not None and slot < MAX_LOADERS:
                settings.slot = slot
                st = LoaderSteps(slot, settings)
                self.record.loaders.append(settings)
                self._loaders[loader] = st
                self._by_slot[slot] = st
            # else: past MAX_LOADERS, counted nowhere rather than mislabelled
        known = self._iterators[id(iterator)] = IteratorCount(st, batch_size, samples)
        return known

    def _epoch_started(self, ev: EpochStarted) -> None:
        self._starting[id(ev[1])] = (ev[2], ev[3], ev[4], ev[5])

    def _announced(
        self, iterator: Any, key: int, known: IteratorCount | None
    ) -> IteratorCount | None:
        """The iterator of a fetch that the segmenter does not know, or whose count fell,
        announced, if there is an announcer (else as it was); where its epoch's start was
        logged, its loader is an evaluation's for the epoch if autograd was off then, and
        may be one (``LoaderSteps.epoch_over``) if the models were in eval mode."""
        starting = self._starting.pop(key, None)
        if self._announce is not None:
            samples_driver = None if starting is None else starting[:2]
            known = self._iterator_started(self._announce(iterator, samples_driver))
        if starting is not None and known is not None and known.loader is not None:
            known.loader.evaluating = not starting[2]
            known.loader.model_evaluating = starting[3] is False
        return known

    def _fetch(self, ev: Fetch) -> None:
        _, iterator, number, t_enter, t_exit, shape, gpu_enter, gpu_exit = ev
        key = id(iterator)
        known = self._iterators.get(key)
        if known is None or number <= known.last:
            known = self._announced(iterator, key, known)
            if known is None:
                self._let_go(gpu_enter, gpu_exit)
                return
        known.last = number
        st = known.loader
        if st is None:
            self._let_go(gpu_enter, gpu_exit)
            return  # a loader past MAX_LOADERS
        read, elements = batch_extent(shape)
        batch = known.batch(number, read)
        first = number == 1
        if st.start >= 0:
            # a new epoch while an earlier one's step is open: the loop left that epoch early
            # (a break), unless it was one batch long (``next(iter(loader))`` every step, or a
            # look at the first batch before training: ``peek``)
            left = first and st.number > 1
            peek = first and st.number == 1 and not self._trained
            if number == 2:  # (its step ends, unused, at this epoch's start)
                for other in left_for(st, self._open.values()):
                    self._close(other, st.start, None, truncated=True)
            self._close(st, t_enter, None if left else gpu_enter, truncated=left, peek=peek)
        elif first and not st.info.fetches:
            self._built_anew(st, t_enter)
        wait = t_exit - t_enter
        info = st.info
        info.fetches += 1
        without = self._optimizer_rows.without_fetch
        if (without.held is not None or without.in_run) and info.is_training:
            self._fetched_again()
        if first or info.fetches == 1 or not self._trained:
            self._first_fetches(st, info, first, t_enter, wait)
        phase = self._phase
        if phase is not st and (phase is not None or not info.optimizer_steps):
            self._change_phase(st, t_enter)
        if not info.optimizer_steps:
            self.away_fetch_ns = t_enter
        slot = st.slot
        fetched = self._optimizer_rows.fetched
        before = fetched.get(slot, 0)
        fetched[slot] = before + batch if before >= 0 and batch >= 0 else -1
        if elements >= 0:  # (its batch was read, not counted: a collate of one's own)
            self._optimizer_rows.fetched_batch(elements, st.evaluating)
        if self._after_optimizer:
            info.leads += 1
            self._after_optimizer = False
        open_steps = self._open
        if open_steps:
            for other in open_steps.values():  # this wait is part of every step still open
                other.wait += wait
                other.inside.add(slot)
        if not st.since_optimizer:
            st.fresh_draws = first
        st.since_optimizer += 1
        st.start = t_enter
        st.number = number
        st.wait = wait
        st.batch = batch
        st.elements = elements
        st.flags = (FLAG_EPOCH_START if first else 0) | (FLAG_EVALUATING if st.evaluating else 0)
        st.gpu_enter = gpu_enter
        st.gpu_exit = gpu_exit
        ledger = self._phases
        st.phase_mark = ledger.mark() if ledger.sampling else ()
        ledger.arrived(t_exit)  # the input copy runs until the next forward starts
        open_steps[slot] = st
        self._current = st
        self._wait_total += wait
        self._last_batch = batch

    def _first_fetches(
        self, st: LoaderSteps, info: LoaderInfo, first: bool, t_enter: int, wait: int
    ) -> None:
        """What a fetch counts when it is the loader's first of the run, begins an epoch, or
        comes before the run's first optimizer step."""
        if info.fetches == 1:
            self.record.first_fetch_wait_ns[st.slot] = wait
            st.first_fetch_ns = t_enter
        if first:
            info.epochs += 1
            self._optimizer_rows.epoch_started = True
            st.epoch_began(self._queue.next_index)
        if not self._trained:
            info.fetches_before_training += 1

    def _built_anew(self, st: LoaderSteps, t_enter: int) -> None:
        """A loader's first fetch: the steps it leaves end, as at a loader's own next epoch,
        and it goes on from a loader built before it (:func:`~.open_steps.goes_on_from`)."""
        left, earlier = goes_on_from(st, self._by_slot.values())
        for other in left:
            self._close(other, t_enter, None, truncated=True)
        if earlier is not None:
            st.info.follows = earlier.slot

    def _change_phase(self, st: LoaderSteps, t_enter: int) -> None:
        """A fetch of ``st`` after another loader's phase, or of a loader no optimizer step has
        followed yet: the phase away from training ends, or begins (see ``LoaderInfo.phase_ns``)."""
        if self._phase is not None:
            self._end_phase(t_enter)
        if not st.info.is_training:
            self._phase, self._phase_start_ns = st, t_enter

    def _exhausted(self, ev: Exhausted) -> None:
        _, iterator, t_enter, gpu_enter = ev
        key = id(iterator)
        known = self._iterators.pop(key, None)
        self._starting.pop(key, None)
        if known is not None and known.loader is not None and known.loader.start >= 0:
            if known.per_batch and known.samples < 0:
                known.loader.batch = -1  # the epoch's last batch, of a sampler without a length
            self._close(known.loader, t_enter, gpu_enter, truncated=False)
            known.loader.epoch_exhausted = True
            if known.loader.epoch is not None:
                known.loader.epoch.exhausted = True
        self._let_go(gpu_enter)  # the end of the step it closed, the start of none

    def _optimizer_step(self, ev: OptimizerStep) -> None:
        _, optimizer, t_ns = ev
        self.record.optimizer_steps += 1
        ledger = self._phases
        for st in self._open.values():
            if st.phase_mark:  # (a step without phases keeps none)
                st.phase_mark = ledger.still_timed(st.phase_mark)
        rows = self._optimizer_rows
        if rows.phase_mark:
            rows.phase_mark = ledger.still_timed(rows.phase_mark)
        if self._markers.phase_mark:
            self._markers.still_timed()
        ledger.turned_off = False  # the optimizer step that turned them off has been seen
        if self._phase is not None:
            self._end_phase(t_ns)
        self._trained = True
        self._after_optimizer = True
        cur = self._current
        trained_on = False  # a loader credited now was fetched since the optimizer step before
        if cur is not None:
            no_fetch = not self._step_before_fetched
            credited, taken_back = credited_loaders(self._by_slot.values(), cur, no_fetch)
            for st in taken_back:
                st.info.optimizer_steps = st.unsteady_credits = 0
                rows.needed = None
            for st in credited:
                trained_on = trained_on or st.since_optimizer > 0
                info = st.info
                if not info.optimizer_steps:
                    rows.needed = None  # a loader is known to train: decide again
                info.optimizer_steps += 1
                if st.start >= 0:
                    st.flags |= FLAG_OPTIMIZER_STEP
                    st.last_optimizer_ns = t_ns
                    st.at_optimizer = (st.wait, frozenset(st.inside) if st.inside else NONE)
            optimizer_stepped(self._by_slot.values())
        key = id(optimizer)
        lead = self._lead_optimizer
        if key != lead:  # (the lead optimizer was recorded at its first step)
            if key not in self._optimizers_seen:
                self._optimizers_seen.add(key)
                self.record.optimizers.append(optimizer_info(optimizer))
            if lead is None:
                lead = self._lead_optimizer = key
            else:
                lead = self._lead_optimizer = rows.rival_stepped(key, lead, t_ns, self._wait_total)
        if key == lead:
            # no training loader's step is open (the one fetched last's, mostly)
            outside = cur is None or cur.start < 0 or not cur.info.is_training
            if outside:
                outside = not any(self._by_slot[slot].info.is_training for slot in self._open)
            made = rows.stepped(t_ns, outside, self._wait_total)
            if made:
                for row in made:
                    self._queue.add(row)
            self._step_before_fetched = trained_on

    def _fetched_again(self) -> None:
        """A training loader fetched, or the run ended: an optimizer step made alone outside
        its steps is no step (its row written only where optimizer rows are)."""
        alone = self._optimizer_rows.fetched_again()
        if alone is not None:
            self._queue.add(alone)

    def _end_phase(self, t_ns: int) -> None:
        """The loader iterated away from training (an evaluation) is done at ``t_ns``: the
        training went on, or another loader is iterated."""
        st = self._phase
        if st is None:
            return
        spent = max(0, t_ns - self._phase_start_ns)
        st.info.phase_ns += spent
        if not self._trained:
            st.info.phase_before_training_ns += spent
        self._phase = None

    def _marker(self, ev: Marker) -> None:
        self.record.markers += 1
        self._queue.add(self._markers.marked(ev[1], self._wait_total, self._last_batch))

    # --- rows --------------------------------------------------------------------------------
    def _close(
        self,
        st: LoaderSteps,
        t_end_ns: int,
        next_gpu: EventLike | None,
        *,
        truncated: bool,
        peek: bool = False,
    ) -> None:
        """Write ``st``'s open step as a row, ending at ``t_end_ns``; cut short (``truncated``:
        the loop left it), none where its batch was never used (a ``break`` before it). A
        ``peek``, a one-batch epoch before the run's first optimizer step, in which no backward
        and no update ran (``model(next(iter(loader)))``, a shape check; Keras builds its model
        so), is noted an evaluation's row: no step where the loader trains."""
        flags, wait = st.flags, st.wait
        inside: set[int] | frozenset[int] = st.inside
        end = t_end_ns
        began = st.start
        mark = st.phase_mark
        host_phases = self._phases.of_step(mark) if mark else None
        unused = False  # fetched and never used: timed, and no model, backward or update ran
        if truncated:
            flags |= FLAG_TRUNCATED
            if st.last_optimizer_ns >= 0:  # it ends there: what came after is no part of it
                end = st.last_optimizer_ns
                wait, inside = st.at_optimizer
            elif host_phases is not None and not any(host_phases[1:]):
                unused = self._phases.totals[1] > 0  # (a model seen: its forward is timed)
        # (no optimizer step yet, an inference over zip(a, b): no training to set apart from)
        if inside and self._trained and any(not self._by_slot[s].info.is_training for s in inside):
            flags |= FLAG_INTERLEAVED
        if not truncated:  # a row that only fetched, or one of work: its phases tell, or its rest
            st.closed(end - began - wait, flags, host_phases)
            rows = self._optimizer_rows
            rows.closed_ns, rows.closed_wait = end, self._wait_total
        if not unused:
            row = (began - self._t0, end - began, wait, st.batch, st.slot, flags)
            self._queue.add((row, host_phases, st.elements))
            if st.number == 1 and not truncated:  # (its epoch's first: see epoch_left)
                st.epoch_row = self._queue.next_index - 1
            if peek and host_phases is not None and not any(host_phases[2:]):
                at = self._queue.next_index
                st.info.evaluation_rows.append((at - 1, at))
        if self._gpu_sink is not None:
            phases, gone = self._phases.gpu_of_step(mark)
            enter, exit_ = st.gpu_enter, st.gpu_exit
            if enter is not None and exit_ is not None and next_gpu is not None:
                written_at = self._queue.next_index - 1
                self._gpu.append((written_at, enter, exit_, next_gpu, phases))
                if gone:
                    self._let_go(*gone)  # the step's own events go with it
            else:
                if phases is not None:
                    gone += [ev for _, start, end_ in phases for ev in (start, end_)]
                self._let_go(*gone, enter, exit_)
            st.gpu_enter = st.gpu_exit = None
        st.start = -1
        if st.inside:
            st.inside.clear()
        st.last_optimizer_ns = -1
        del self._open[st.slot]

    def _let_go(self, *events: EventLike | None) -> None:
        """The segmenter holds ``events`` no longer (handed on after the steps queued so far)."""
        if self._gpu_sink is not None:
            closed = len(self._gpu)
            self._gpu_done.extend((closed, ev) for ev in events if ev is not None)

    def _flush(self) -> None:
        """Write the queued rows in one go, then hand the GPU figures of those rows on (and the
        phases' events, when no loader's step is open to claim them: a loop without one)."""
        if not self._open and self._phases.gpu_pending:
            self._let_go(*self._phases.gpu_of_step(())[1])
        self._queue.write()
        if self._gpu or self._gpu_done:
            steps, self._gpu = self._gpu, []
            done, self._gpu_done = self._gpu_done, []
            assert self._gpu_sink is not None
            self._gpu_sink(steps, done)
