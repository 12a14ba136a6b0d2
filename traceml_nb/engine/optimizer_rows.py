"""The lead optimizer's rows, as the step segmenter (:mod:`traceml_nb.engine.segment`) makes them:
one row from each of its ``step()`` calls to the next, with the data wait and the samples of
the training fetches between. They are the steps of a loop without a DataLoader, of a loop
that fetches its next batch before it uses the current one (``fetches_ahead``), of a loop
that fetched all its batches before it trained, and of the steps made while no training
loader's step is open (``FLAG_NO_FETCH``); elsewhere they are written only until the training
loaders are known to fetch in step (:func:`optimizer_rows_decided`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .open_steps import LoaderSteps, Row
from .phase_ledger import Mark, PhaseLedger
from .record import (
    FLAG_EPOCH_START,
    FLAG_INTERLEAVED,
    FLAG_NO_FETCH,
    FLAG_OPTIMIZER_STEP,
    SOURCE_OPTIMIZER,
    LoaderInfo,
)

#: An optimizer other than the lead takes the lead at its this-many-th step in a row with none
#: of the lead's: a sweep's, a fold's, a training stage's new optimizer, which steps hundreds of
#: times, and not a GAN's generator stepped a few times for each step of the discriminator (at
#: 2, a toy GAN's 50 iterations read 101 steps).
LEAD_TAKEOVER_STEPS = 4


class OptimizerRows:
    """The lead optimizer's rows of one run: what each needs from the fetches before it, and
    whether they are written (:attr:`needed`)."""

    __slots__ = (
        "_by_slot",
        "_phases",
        "_t0",
        "prev_ns",
        "wait_mark",
        "phase_mark",
        "closed_ns",
        "closed_wait",
        "fetched",
        "_before",
        "_newest",
        "_carried",
        "epoch_started",
        "needed",
        "without_fetch",
        "_rival",
        "_took_lead",
    )

    def __init__(self, by_slot: Mapping[int, LoaderSteps], phases: PhaseLedger, t0: int) -> None:
        self._by_slot = by_slot
        self._phases = phases
        self._t0 = t0
        self.prev_ns = 0  #: the previous optimizer step (0: none yet)
        self.wait_mark = 0  #: the run's data wait at it, ns
        self.phase_mark: Mark = ()  #: the phase totals at it, () when it was not sampled
        self.closed_ns = self.closed_wait = 0  #: the last loader step's end, the wait till it
        #: the loader slots fetched since the last optimizer step: the samples of their batches
        self.fetched: dict[int, int] = {}  # (-1: a batch of unknown size)
        #: the elements of those batches (an evaluation's aside) but the newest, and of the
        #: newest (-1: one not told; None: none), and the last step's newest, trained on in
        #: this one where fetched ahead
        self._before: int | None = None
        self._newest: int | None = None
        self._carried: int | None = None
        self.epoch_started = False  #: an epoch began since the last optimizer step
        self.needed: bool | None = None  #: optimizer rows needed, once it is decided
        self.without_fetch = StepsWithoutFetch()
        #: another optimizer's steps in a row since the lead's last one: its ``id`` and
        #: ``(t_ns, wait, phase mark)`` of each
        self._rival: tuple[int, list[tuple[int, int, Mark]]] | None = None
        #: the earlier steps of the optimizer that took the lead, their rows not written yet
        self._took_lead: list[tuple[int, int, Mark]] = []

    def rival_stepped(self, key: int, lead: int, t_ns: int, wait_total: int) -> int:
        """An optimizer other than the lead (``id`` ``key``, the lead's ``lead``) stepped at
        ``t_ns``: the lead from now on where this is its ``LEAD_TAKEOVER_STEPS``-th step in a
        row with none of the lead's (the first optimizer steps no more: a new model and
        optimizer for each trial of a sweep, each fold, each stage of training), its earlier
        steps rows' ends too (:meth:`stepped` writes them); else ``lead``."""
        mark = self._phases.mark() if self._phases.sampling else ()
        rival = self._rival
        if rival is None or rival[0] != key:
            rival = self._rival = (key, [])
        rival[1].append((t_ns, wait_total, mark))
        if len(rival[1]) < LEAD_TAKEOVER_STEPS:
            return lead
        self._took_lead, self._rival = rival[1][:-1], None
        return key

    def stepped(self, t_ns: int, outside: bool, wait_total: int) -> list[Row] | None:
        """The lead optimizer stepped at ``t_ns`` (``outside`` any training loader's step; the
        run's data wait so far ``wait_total``): the rows to write now, if any (the lead's
        earlier steps before, where it has just taken the lead)."""
        self._rival = None
        ledger = self._phases
        mark = ledger.mark() if ledger.sampling else ()
        took = self._took_lead
        if not took:
            return self._ended(t_ns, outside, wait_total, mark)
        self._took_lead = []
        rows: list[Row] = []
        for t_before, wait_before, mark_before in took:
            rows += self._ended(t_before, outside, wait_before, mark_before) or []
        return rows + (self._ended(t_ns, outside, wait_total, mark) or []) or None

    def _ended(self, t_ns: int, outside: bool, wait_total: int, mark: Mark) -> list[Row] | None:
        """The row of the lead's step at ``t_ns`` (the phase totals then ``mark``), if any."""
        rows = None
        elements = self._trained_elements()
        if outside:
            rows = self.without_fetch.stepped(self._row(t_ns, True, wait_total, elements))
        elif self.needed is not False and self.decided():
            rows = [self._row(t_ns, False, wait_total, elements)]
        self.prev_ns = t_ns
        self.wait_mark = wait_total
        self.phase_mark = mark
        self.fetched.clear()
        self.epoch_started = False
        return rows

    def decided(self) -> bool:
        """Optimizer rows are the steps, or may be (:func:`optimizer_rows_decided`: kept once
        decided, until another loader starts to train, which sets :attr:`needed` to None).
        Once decided, each training loader keeps how it fetches (``LoaderInfo.ahead_decided``):
        the rows written follow that decision, and so must the step rule."""
        if self.needed is None:
            self.needed = optimizer_rows_decided(self._by_slot.values())
            if self.needed is not None:
                for st in self._by_slot.values():
                    info = st.info
                    if info.is_training and info.ahead_decided is None:
                        info.ahead_decided = info.fetches_ahead
        return self.needed is not False

    def fetched_again(self) -> Row | None:
        """A training loader fetched, or the run ended: an optimizer step made alone outside
        its steps is no step (its row, to write only where optimizer rows are)."""
        alone = self.without_fetch.fetched()
        if alone is not None and self.needed is not False and self.decided():
            return alone
        return None

    def fetched_batch(self, elements: int, evaluating: bool) -> None:
        """A loader fetched a batch of ``elements`` (its first tensor's, where read), in an
        epoch begun with autograd off (``evaluating``: no training batch) or not."""
        if not evaluating:
            self._before = _together(self._before, self._newest)
            self._newest = elements

    def _trained_elements(self) -> int:
        """The elements of the training batches this step trained on (-1: not all told): those
        fetched since the last step; where the training loaders fetch ahead (a trainer's
        prefetch; before that is decided, where their first rows say so), the last step's
        newest and all but the newest of this one's."""
        if self._newest is None and self._carried is None:
            return -1  # (none read since the last step, nor carried: checked first, as cheap)
        by_slot = self._by_slot
        ahead = any(_seems_ahead(st.info) for st in by_slot.values() if st.info.is_training)
        if ahead:
            trained = _together(self._carried, self._before)
        else:
            trained = _together(self._before, self._newest)
        self._carried, self._before, self._newest = self._newest, None, None
        return -1 if trained is None else trained

    def _row(self, t_ns: int, outside: bool, wait_total: int, elements: int) -> Row:
        """The row from the previous optimizer step (the first: the training loaders' first
        fetch; made ``outside`` any training loader's step where those are the steps: the last
        one's end, if later) to this one: the data wait of the fetches between, the samples
        trained."""
        start, wait_mark = self.prev_ns, self.wait_mark
        if start and outside and self.needed is False and self.closed_ns > start:
            start, wait_mark = self.closed_ns, self.closed_wait  # after the loader's rows
        by_slot = self._by_slot
        if not start:
            start = first_training_fetch(by_slot.values(), t_ns, self._t0)
        flags = FLAG_OPTIMIZER_STEP | (FLAG_NO_FETCH if outside else 0)
        if any(not by_slot[s].info.is_training for s in self.fetched):
            flags |= FLAG_INTERLEAVED
        if self.epoch_started:
            flags |= FLAG_EPOCH_START
        samples = samples_trained(self.fetched, by_slot)
        phases = self.phase_mark
        wait = wait_total - wait_mark
        row = (start - self._t0, t_ns - start, wait, samples, SOURCE_OPTIMIZER, flags)
        return row, self._phases.of_step(phases) if phases else None, elements


class StepsWithoutFetch:
    """The optimizer steps made while no training loader's step is open (rows flagged
    ``FLAG_NO_FETCH``): two or more before a training loader's next fetch are the loop's steps
    on batches it kept (``itertools.cycle(loader)`` after its first epoch, a list of the
    loader's batches); one alone is not (a step after an epoch's last batch, on the gradients
    of an unfinished accumulation cycle). The first is held until the second comes."""

    __slots__ = ("held", "in_run")

    def __init__(self) -> None:
        self.held: Row | None = None
        self.in_run = False  #: two have come since a training loader's last fetch

    def stepped(self, row: Row) -> list[Row]:
        """The rows to write now, of an optimizer step made outside: none while it is alone."""
        if self.in_run:
            return [row]
        if self.held is None:
            self.held = row
            return []
        held, self.held, self.in_run = self.held, None, True
        return [held, row]

    def fetched(self) -> Row | None:
        """A training loader fetched (or the run ended): the step held alone, its flag off."""
        held, self.held, self.in_run = self.held, None, False
        if held is None:
            return None
        (start, wall, wait, batch, source, flags), phases, elements = held
        return (start, wall, wait, batch, source, flags & ~FLAG_NO_FETCH), phases, elements


def _together(a: int | None, b: int | None) -> int | None:
    """The elements of two parts (None: no batch; -1: not told)."""
    if a is None or b is None:
        return b if a is None else a
    return -1 if a < 0 or b < 0 else a + b


def _seems_ahead(info: LoaderInfo) -> bool:
    """The loader fetches ahead: as decided, or until then, as its rows tell so far (the
    FLOP count's step, the run's second, comes before the decision)."""
    decided = info.fetches_ahead  # (undecided: no row without a step has come yet)
    if decided is not None:
        return decided
    return bool(info.epoch_first_rows_without_step or info.fetch_only_rows)


def first_training_fetch(loaders: Iterable[LoaderSteps], t_ns: int, default: int) -> int:
    """When the training loaders' first fetch of the run was entered, if before ``t_ns`` (the
    run's first optimizer step), else ``default``."""
    firsts = [
        st.first_fetch_ns
        for st in loaders
        if st.info.is_training and 0 <= st.first_fetch_ns <= t_ns
    ]
    return min(firsts, default=default)


def samples_trained(fetched: Mapping[int, int], by_slot: Mapping[int, LoaderSteps]) -> int:
    """The samples of an optimizer step's row: of the batches the training loaders gave since
    the previous optimizer step (``fetched``: slot -> samples, -1 where a batch's size is
    unknown), all the batches of a gradient-accumulation cycle; -1 where one's size is unknown
    or no training loader was fetched."""
    counts = [n for slot, n in fetched.items() if by_slot[slot].info.is_training]
    return sum(counts) if counts and min(counts) >= 0 else -1


def optimizer_rows_decided(loaders: Iterable[LoaderSteps]) -> bool | None:
    """Whether the optimizer steps' rows are the steps, once the training loaders have shown
    how they fetch: True where one of them fetches ahead of its steps, False where none does;
    None while no loader trains or one has not shown it yet (the rows are written meanwhile)."""
    ahead = [st.info.fetches_ahead for st in loaders if st.info.is_training]
    if ahead and None not in ahead:
        return any(ahead)
    return None
