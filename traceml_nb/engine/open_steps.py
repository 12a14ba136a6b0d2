"""What the step segmenter (:mod:`traceml_nb.engine.segment`) keeps while a run goes on: each
loader's open step and counters, and each iterator's batch count and how its batches are
counted."""

from __future__ import annotations

from collections.abc import Collection
from math import prod
from typing import Any

from .events import EventLike
from .phase_ledger import Mark
from .record import (
    FLAG_EPOCH_START,
    FLAG_EVALUATING,
    FLAG_OPTIMIZER_STEP,
    LoaderInfo,
)

#: A step without an optimizer step, its phases not timed, whose time outside ``next()`` is at
#: most this share of a step's with one did next to nothing but fetch: a batch fetched ahead
#: (transformers' Trainer fetches every batch of a gradient-accumulation cycle, then trains on
#: them: the fetches' rows were 0.15-1.5 ms against 24-72 ms), not a micro-step of gradient
#: accumulation nor a step whose optimizer step GradScaler skipped (their forward and backward
#: take about as long as the step's with one)...
FETCH_ONLY_SHARE = 0.25
#: ...of the least rest of the next this many steps with one: a run's first steps with an
#: optimizer step are slow (the instruments seek the model, the optimizer makes its state, the
#: FLOP count runs on one), and one of three is a step's own. (Against the first alone, the
#: FLOP-counted step's 2.6 ms where a step's rest was 0.2 ms, the forward and backward of the
#: four steps whose optimizer step GradScaler skipped read as batches fetched ahead.)
STEPS_TO_TELL_ROWS = 3
#: The drivers whose loaders always fetch one batch ahead (``LoaderInfo.driver``): accelerate's
#: prepared loader fetches the next batch before it hands over the current one, so an epoch's
#: first row holds its first fetch alone and its last batch is trained on after the
#: exhausting fetch, outside the rows; an epoch left before it was exhausted (a ``break`` at
#: ``max_train_steps``) has no such batch, and its first row is no step (61 steps of 60).
FETCHES_AHEAD_DRIVERS = frozenset({"accelerate"})


class LoaderSteps:
    """One loader's open step and counters."""

    __slots__ = (
        "slot",
        "info",
        "start",
        "wait",
        "batch",
        "elements",
        "flags",
        "inside",
        "last_optimizer_ns",
        "at_optimizer",
        "gpu_enter",
        "gpu_exit",
        "since_optimizer",
        "first_fetch_ns",
        "phase_mark",
        "rests_without_step",
        "steps_after_rests",
        "least_step_rest",
        "evaluating",
        "fresh_draws",
        "drawn_last_step",
        "unsteady_credits",
        "model_evaluating",
        "epoch_credits",
        "epoch_in_eval_mode",
        "trained_in_train_mode",
        "epoch",
        "number",
        "epoch_row",
        "epoch_exhausted",
    )

    def __init__(self, slot: int, info: LoaderInfo) -> None:
        self.slot = slot
        self.info = info
        self.start = -1  #: entry of the open step's fetch, -1 while no step is open
        self.number = 0  #: the open step's batch number in its iterator (1: an epoch's first)
        self.wait = 0
        self.batch = -1
        #: the elements of the open step's batch's first tensor (-1: not read, or counted)
        self.elements = -1
        self.flags = 0
        self.inside: set[int] = set()  #: slots of the other loaders fetched inside the open step
        self.last_optimizer_ns = -1  #: the last optimizer step inside the open step
        #: the open step's data wait and the other loaders fetched inside it, at that step
        self.at_optimizer: tuple[int, frozenset[int]] = (0, NONE)
        self.gpu_enter: EventLike | None = None
        self.gpu_exit: EventLike | None = None
        self.since_optimizer = 0  #: fetches since the last optimizer step
        self.first_fetch_ns = -1  #: when the loader's first fetch of the run was entered
        #: the phase totals when the open step began, () when it began unsampled
        self.phase_mark: Mark = ()
        #: the time outside ``next()`` of each step closed without an optimizer step and not
        #: told apart yet (fetch-only or not), ns, and whether it began an epoch
        self.rests_without_step: list[tuple[int, bool]] = []
        self.steps_after_rests = 0  #: steps with one closed since the first of those
        self.least_step_rest = -1  #: the least of their rests, ns
        #: its epoch began with autograd off (under ``torch.no_grad()``): an evaluation's
        #: batches, which no optimizer step is credited to
        self.evaluating = False
        #: its first fetch since the last optimizer step began an epoch (``next(iter(loader))``)
        self.fresh_draws = False
        #: it was fetched in the step before (between the two optimizer steps before the last
        #: one that had fetches between them)
        self.drawn_last_step = False
        #: optimizer steps credited to it while no loader had been drawn in the step before
        self.unsteady_credits = 0
        #: its epoch began with autograd on and every model the phase instruments found in
        #: eval mode (``model.eval()``): an evaluation's if no optimizer step follows
        self.model_evaluating = False
        #: its optimizer steps when its current epoch began, and whether that began so
        self.epoch_credits = 0
        self.epoch_in_eval_mode = False
        #: its last epoch that trained began with a model in training mode (or none found)
        self.trained_in_train_mode = False
        #: what an epoch begun with the models in eval mode did (:meth:`epoch_over`)
        self.epoch: EpochWork | None = None
        #: the step table's row of its epoch's first step, once written (-1: none), and
        #: whether its iterator was exhausted (:meth:`epoch_left`)
        self.epoch_row = -1
        self.epoch_exhausted = False

    def closed(self, rest_ns: int, flags: int, phases: tuple[int, ...] | None) -> None:
        """A step closed with ``flags``, ``rest_ns`` of it outside ``next()``, with the phases
        the instruments timed in it (``PHASE_COLUMNS``; None: not timed). One without an
        optimizer step did work if a forward or a backward ran in it (its phases say so), else
        only fetched; one not timed is told by its rest (:meth:`tell_rows_apart`) once
        :data:`STEPS_TO_TELL_ROWS` steps with one have closed after it."""
        info = self.info
        if flags & FLAG_EVALUATING:
            return  # an evaluation's batch, over the training set: no training step to tell
        epoch = self.epoch
        if epoch is not None:
            epoch.closed(phases)
        if not flags & FLAG_OPTIMIZER_STEP:
            epoch_first = bool(flags & FLAG_EPOCH_START)
            if phases is None:
                self.rests_without_step.append((rest_ns, epoch_first))
                info.rows_untold += 1
            else:
                _count_row(info, phases[1] + phases[2] > 0, epoch_first)
            return
        info.rows_with_step += 1
        if not self.rests_without_step:
            return
        least = self.least_step_rest
        self.least_step_rest = rest_ns if least < 0 else min(least, rest_ns)
        self.steps_after_rests += 1
        if self.steps_after_rests >= STEPS_TO_TELL_ROWS:
            self.tell_rows_apart()

    def tell_rows_apart(self) -> None:
        """Count the steps closed without an optimizer step (:attr:`rests_without_step`), once
        a step with one closed after them (the run's end tells them with fewer than
        :data:`STEPS_TO_TELL_ROWS`), against the least rest of those: fetch-only
        (``LoaderInfo.fetch_only_rows``, ``epoch_first_rows_without_step`` for an epoch's first:
        a trainer's batch fetched ahead) or rows of work (``rows_without_step``: gradient
        accumulation, an optimizer step skipped)."""
        rests, info = self.rests_without_step, self.info
        if not rests or self.least_step_rest < 0:
            return
        bound = FETCH_ONLY_SHARE * self.least_step_rest
        for rest, epoch_first in rests:
            _count_row(info, rest > bound, epoch_first)
        rests.clear()
        info.rows_untold = 0
        self.steps_after_rests, self.least_step_rest = 0, -1

    def epoch_began(self, first_row: int) -> None:
        """Its epoch's first fetch, whose row will be the step table's ``first_row``: the epoch
        before is over (:meth:`epoch_over`), and this one is watched if it began with autograd
        on and the models in eval mode where the loader's training epochs begin in training
        mode (a loop that trains in eval mode tells nothing by it)."""
        self.epoch_over(first_row)
        self.epoch_left()
        self.epoch_exhausted = False
        self.epoch_credits = self.info.optimizer_steps
        self.epoch_in_eval_mode = self.model_evaluating
        if self.model_evaluating and not self.evaluating and self.trained_in_train_mode:
            self.epoch = EpochWork(first_row, self.info, len(self.rests_without_step))

    def epoch_left(self) -> None:
        """Its epoch is over (its next began, or the run ended): where its loader fetches
        ahead (:data:`FETCHES_AHEAD_DRIVERS`) and it was left before it was exhausted, its
        first row only fetched and is no step (``LoaderInfo.ahead_rows``)."""
        ahead = self.info.driver in FETCHES_AHEAD_DRIVERS
        if ahead and not self.epoch_exhausted and self.epoch_row >= 0:
            self.info.ahead_rows.append(self.epoch_row)
        self.epoch_row = -1

    def epoch_over(self, end_row: int) -> None:
        """Its epoch is over, its rows before the step table's ``end_row``: an evaluation's
        (:meth:`EpochWork.evaluation`), its rows are noted (``LoaderInfo.evaluation_rows``)
        and count nothing of how the loader trains."""
        info = self.info
        if info.optimizer_steps > self.epoch_credits:  # it trained
            self.trained_in_train_mode = not self.epoch_in_eval_mode
        epoch, self.epoch = self.epoch, None
        # its loader trained before it, and no optimizer step was credited to it since it
        # began (its next epoch begins, or the run ended after its last batch)
        untrained = 0 < self.epoch_credits == info.optimizer_steps
        if epoch is None or not (untrained and epoch.evaluation()):
            return
        info.evaluation_rows.append((epoch.first_row, end_row))
        counted = epoch.counted
        info.rows_without_step, info.fetch_only_rows, info.epoch_first_rows_without_step = counted
        told = len(self.rests_without_step) - epoch.untold  # (none were told since it began)
        if told > 0:
            del self.rests_without_step[epoch.untold :]
            info.rows_untold -= told


class EpochWork:
    """What an epoch of a loader did that began with autograd on and the models in eval mode
    (``model.eval()`` without ``torch.no_grad()``): enough to tell, once it is over, an
    evaluation over the training set, and what its rows counted, to take back then."""

    __slots__ = ("first_row", "rows", "backward", "counted", "untold", "exhausted")

    def __init__(self, first_row: int, info: LoaderInfo, untold: int) -> None:
        self.first_row = first_row  #: the step table's index of its first row
        self.rows = 0  #: its steps closed so far (not those a break or the run's end cut short)
        self.backward = False  #: a step of it that the instruments timed ran a backward
        #: the loader's counts of rows without an optimizer step when it began, and how many
        #: of those were not told apart yet
        counted = (info.rows_without_step, info.fetch_only_rows, info.epoch_first_rows_without_step)
        self.counted = counted
        self.untold = untold
        self.exhausted = False  #: its iterator raised ``StopIteration``

    def closed(self, phases: tuple[int, ...] | None) -> None:
        """One of its steps closed, with the phases the instruments timed in it
        (``PHASE_COLUMNS``; None: not timed)."""
        self.rows += 1
        if phases is not None and phases[2] > 0:
            self.backward = True

    def evaluation(self) -> bool:
        """Over without an optimizer step, was it an evaluation's? It closed a step, and no
        step of it that the instruments timed ran a backward."""
        return self.rows > 0 and not self.backward


def _count_row(info: LoaderInfo, worked: bool, epoch_first: bool) -> None:
    """Count a step closed without an optimizer step: of work, or fetch-only."""
    if worked:
        info.rows_without_step += 1
    elif epoch_first:
        info.epoch_first_rows_without_step += 1
    else:
        info.fetch_only_rows += 1


class IteratorCount:
    """An iterator the segmenter was told of (an :class:`~.events.IteratorStarted`): its
    loader's steps (None: a loader past ``MAX_LOADERS``, counted nowhere), the batch size
    ``per_batch`` and the epoch's ``samples`` (-1 unknown) its batches are counted with (0:
    their sizes are read: :func:`traceml_nb.engine.instrument.loader.counted_batch_size`), and
    its batch count at its last fetch."""

    __slots__ = ("loader", "per_batch", "samples", "last")

    def __init__(self, loader: LoaderSteps | None, per_batch: int, samples: int) -> None:
        self.loader = loader
        self.per_batch = per_batch
        self.samples = samples
        self.last = 0

    def batch(self, number: int, read: int) -> int:
        """Samples in batch ``number`` (from 1) of the epoch, ``read`` being the size the
        fetch read off the batch (-1: not read). Counted, ``per_batch`` for every batch but
        the epoch's last, which holds what is left; where ``samples`` is unknown (the sampler
        has no length) every batch counts as full, and the segmenter makes the epoch's last
        one unknown when the epoch ends."""
        per_batch = self.per_batch
        if not per_batch:
            return read
        if self.samples < 0:
            return per_batch
        left = self.samples - (number - 1) * per_batch
        return (per_batch if per_batch < left else left) if left > 0 else -1


#: No other loader fetched inside a step (``LoaderSteps.at_optimizer``).
NONE: frozenset[int] = frozenset()


def batch_extent(shape: Any) -> tuple[int, int]:
    """The samples (the first dimension) and the elements of the shape of a batch's first
    tensor, as the tracer read it (:func:`~traceml_nb.engine.instrument.loader.batch_shape_of`),
    each -1 where not told (None, a shape of no dimension, one that is no sequence of ints)."""
    if shape is None:
        return -1, -1
    try:
        return int(shape[0]), int(prod(shape))
    except Exception:
        return -1, -1


def credited_loaders(
    loaders: Collection[LoaderSteps], last: LoaderSteps, after_no_fetch: bool = False
) -> tuple[list[LoaderSteps], list[LoaderSteps]]:
    """Which loaders an optimizer step credits (their batches train), ``last`` the loader
    fetched last before it, and which lose what they were credited: ``(credited, taken_back)``.

    Credited: ``last``, and any loader fetched alongside it since the previous optimizer step,
    no more often than it (``zip(a, b)``, an outer loader around an inner draw); not an
    evaluation that ran since (more batches than that, or an epoch begun under
    ``torch.no_grad()``), nor a loader whose epoch began since the previous optimizer step and
    that was not drawn in the step before (``if step % 20 == 0: next(iter(val_loader))``, or
    a few batches of it, with autograd on: an evaluation's). Such a fresh epoch is credited
    where the loader was drawn in the step before too (a second dataset's batch drawn in
    every step, a new epoch of the training loader), or where no loader has a step before
    (the run's first: every one), but not where the step before fetched nothing
    (``after_no_fetch``: the loop trains on tensors of its own, and a loader's epoch now is
    an evaluation's, autograd on or not). Taken back: a loader credited only for lack of a
    step before, not drawn in this one while another was drawn again (a validation batch
    drawn beside the first). Each credit for lack of a step before is counted in the
    loader's ``unsteady_credits``."""
    ahead_of = last.since_optimizer
    trains: list[LoaderSteps] = []
    steady: list[LoaderSteps] = []
    fetched = False  # one of the steady loaders was fetched since the previous optimizer step
    for st in loaders:  # (a loop, not comprehensions: this runs at every optimizer step)
        if st.evaluating or not (
            st is last or 0 < st.since_optimizer <= ahead_of and st.start >= 0
        ):
            continue
        trains.append(st)
        if not st.fresh_draws or st.drawn_last_step and not after_no_fetch:
            steady.append(st)
            fetched = fetched or st.since_optimizer > 0
    if not steady:
        if after_no_fetch:
            return [], []
        for st in trains:
            st.unsteady_credits += 1
        return trains, []
    if not fetched:  # (a GAN's second optimizer)
        return steady, []
    taken_back = []
    for st in loaders:
        credits = st.unsteady_credits  # (0 < optimizer_steps == credits, not drawn in this one)
        if credits and not st.since_optimizer and st.info.optimizer_steps == credits:
            taken_back.append(st)
    return steady, taken_back


def optimizer_stepped(loaders: Collection[LoaderSteps]) -> None:
    """After an optimizer step is credited: the loaders fetched since the one before it are the
    ones drawn in the step before, unless none was (a GAN's second optimizer), and each
    loader's count of fetches starts again."""
    for st in loaders:
        if st.since_optimizer:
            break
    else:
        return  # none was fetched: the counts are 0, and the step before stays the one it was
    for st in loaders:
        st.drawn_last_step = st.since_optimizer > 0
        st.since_optimizer = 0


#: A step row, its phases (``PHASE_COLUMNS``; None: none) and the elements of the batches it
#: trained on (their first tensor's, -1: not told), as the segmenter writes them.
Row = tuple[tuple[int, int, int, int, int, int], "tuple[int, int, int, int] | None", int]


def goes_on_from(
    st: LoaderSteps, loaders: Collection[LoaderSteps]
) -> tuple[list[LoaderSteps], LoaderSteps | None]:
    """At a loader's first fetch (``st``): ``(the steps it leaves, the loader it goes on
    from)``. Of the loaders over the same dataset, iterated the same way (autograd on or off;
    a training one's, in the models' mode too): those whose step is open after two batches or
    more of an epoch were left (a new DataLoader each epoch, and a ``break``), and ``st`` goes
    on from the earliest that none goes on from yet and whose step is not open, or is left
    (not one whose epoch's first step is open: drawn beside it, ``zip``),
    ``LoaderInfo.follows``."""
    info = st.info
    same = [
        other
        for other in loaders
        if other is not st
        and other.info.over_same_dataset(info)
        and other.evaluating == st.evaluating
        and (other.model_evaluating == st.model_evaluating or not other.info.is_training)
    ]
    left = [other for other in same if other.start >= 0 and other.number > 1]
    followed = {other.info.follows for other in loaders}
    for other in same:
        if other.slot not in followed and (other.start < 0 or other in left):
            return left, other
    return left, None


def left_for(st: LoaderSteps, loaders: Collection[LoaderSteps]) -> list[LoaderSteps]:
    """At ``st``'s second fetch of an epoch: the training loaders it was left for, whose
    steps the segmenter then closes. A loader whose step is open after two batches or more of
    its epoch, opened before ``st``'s epoch began and credited an optimizer step since, was
    left by a ``break`` for ``st`` (two training loaders taking turns by epoch: each switch
    read one step too many, the left loader's batch fetched and broken on): that optimizer
    step was ``st``'s first batch's, and is moved to its open step. Not an outer loader around
    draws of ``st`` (its next batch comes before ``st``'s next update), nor a loader drawn
    beside it (``zip``: fetched again since ``st``'s epoch began)."""
    began = st.start
    left = [
        other
        for other in loaders
        if other is not st
        and 0 <= other.start < began
        and other.number > 1
        and other.last_optimizer_ns > began
        and other.info.is_training
    ]
    for other in left:
        st.flags |= FLAG_OPTIMIZER_STEP
        other.flags &= ~FLAG_OPTIMIZER_STEP
        other.last_optimizer_ns = -1
    return left
