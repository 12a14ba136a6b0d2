"""What the instruments log on the training thread, in order, and the typed events the step
segmenter (:mod:`traceml_nb.engine.segment`) reads.

The training thread appends plain tuples whose first item is the event's kind (``FETCH``,
``EXHAUSTED``, ``OPTIMIZER_STEP``, ``MARKER``, ``PHASE``, ``SAMPLING``) and whose other items are the event's fields,
in the order of the event's class below: a tuple of locals costs the hot path about nothing,
where building an object of a class of ours costs a call. A logged tuple *is* its event: the
segmenter dispatches on the kind and unpacks the fields in their class's order, so the tracer
hands the log on as it is, adding the :class:`IteratorStarted` events the segmenter needs.
:func:`typed` gives a logged tuple its class, to read its fields by name (tests, debugging).

Times are ``time.perf_counter_ns()`` values. Iterators and optimizers are the objects
themselves; the segmenter names them by ``id()``, which is only reused once an object is gone
(and an iterator is announced again whenever its fetch count starts over).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any, Protocol

from .record import LoaderInfo


class EventLike(Protocol):
    """A CUDA event as the instruments use one (``torch.cuda.Event(enable_timing=True)``, or a
    test's simulated one): recorded on a stream, queried without blocking, timed against
    another, ms."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...
    def synchronize(self) -> None: ...


#: The kind of a logged event: the first item of its tuple.
FETCH, EXHAUSTED, OPTIMIZER_STEP, MARKER, EPOCH_STARTED, ITERATOR_STARTED, PHASE, SAMPLING = range(
    8
)

#: What a :class:`Phase` spanned (its ``phase`` field): the model's forward (the outermost
#: modules' calls), the autograd backward, the optimizer's ``step()``; ``SETUP``, the phase
#: instruments put in place at a sampled step's model call, before its forward is timed: it
#: ends the input copy and is no phase of the step (its time is in the rest); and
#: ``BEFORE_CLOSURE``, an optimizer's step from its start to its closure's first phase
#: (``optimizer.step(closure)``): the closure's way to the model where no forward ran since the
#: batch came (Lightning's ``training_step`` before its model call, skorch's copy of the
#: batch), which is the input copy's, else the update's.
FORWARD, BACKWARD, OPTIMIZER, SETUP, BEFORE_CLOSURE = range(5)
#: Each of those by its name (the analysis's).
PHASE_NAMES = ("forward", "backward", "optimizer")


class _Event(tuple):  # type: ignore[type-arg]
    """A logged tuple under its event class: fields by name (``_fields``, from the second item
    on; the first is the kind) and shown by name."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __repr__(self) -> str:
        pairs = zip(self._fields, self[1:], strict=True)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in pairs)})"


def _field(index: int, doc: str) -> Any:
    """The event's field ``index`` (from 1: item 0 is the kind)."""
    return property(itemgetter(index), doc=doc)


class Fetch(_Event):
    """A batch returned by a DataLoader iterator's ``__next__``."""

    __slots__ = ()
    _fields = ("iterator", "number", "t_enter_ns", "t_exit_ns", "shape", "gpu_enter", "gpu_exit")
    iterator: Any = _field(1, "the iterator")
    number: int = _field(2, "batches the iterator has yielded this epoch, this one included")
    t_enter_ns: int = _field(3, "when __next__ was entered")
    t_exit_ns: int = _field(4, "when it returned the batch")
    shape: Any = _field(
        5,
        "the shape of the batch's first tensor as read off it (its first dimension the "
        "samples, open_steps.batch_extent); None where it could not be read, or was not: a loader "
        "whose sizes the segmenter counts (IteratorStarted.batch_size)",
    )
    gpu_enter: EventLike | None = _field(6, "CUDA event recorded at the entry (None off CUDA)")
    gpu_exit: EventLike | None = _field(7, "CUDA event recorded at the exit")


class Exhausted(_Event):
    """``__next__`` raised ``StopIteration``: the iterator's epoch is over."""

    __slots__ = ()
    _fields = ("iterator", "t_enter_ns", "gpu_enter")
    iterator: Any = _field(1, "the iterator")
    t_enter_ns: int = _field(2, "when __next__ was entered")
    gpu_enter: EventLike | None = _field(3, "CUDA event recorded at the entry (None off CUDA)")


class OptimizerStep(_Event):
    """An ``optimizer.step()`` has returned."""

    __slots__ = ()
    _fields = ("optimizer", "t_ns")
    optimizer: Any = _field(1, "the optimizer")
    t_ns: int = _field(2, "when it returned")


class Marker(_Event):
    """An explicit end of a step: ``traceml_nb.step()``."""

    __slots__ = ()
    _fields = ("t_ns",)
    t_ns: int = _field(1, "when it was called")


class EpochStarted(_Event):
    """An iterator's first batch of an epoch is about to be logged: how many samples its
    sampler holds now (a sampler's length may change between epochs); logged by the
    training thread, kept by the segmenter for that fetch, which has the tracer announce the
    iterator (an :class:`IteratorStarted`) with these fields."""

    __slots__ = ()
    _fields = ("iterator", "samples", "driver", "grad", "model_training")
    iterator: Any = _field(1, "the iterator")
    samples: int = _field(2, "samples in the epoch that starts, -1 unknown")
    driver: str | None = _field(3, "what iterates it: a trainer's package (LoaderInfo.driver)")
    grad: bool = _field(
        4,
        "autograd was on at the fetch: False for an epoch begun under torch.no_grad() or "
        "torch.inference_mode(), an evaluation's",
    )
    model_training: bool | None = _field(
        5,
        "a model the phase instruments found was in training mode (Module.training): False "
        "where each was in eval mode (model.eval()), None where none was found yet",
    )


class IteratorStarted(_Event):
    """An iterator whose next :class:`Fetch` begins its epoch, or that the segmenter has not
    seen yet (it started before the run); made by the tracer, never logged."""

    __slots__ = ()
    _fields = ("iterator", "loader", "settings", "batch_size", "samples")
    iterator: Any = _field(1, "the iterator")
    loader: int = _field(
        2, "the key of the loader's batch sampler: the same across epochs, never another loader's"
    )
    settings: LoaderInfo | None = _field(3, "the loader's settings the first time it is seen")
    batch_size: int = _field(
        4,
        "the batch size the segmenter counts this iterator's batches with (0: their sizes are "
        "read from the batches: see traceml_nb.engine.instrument.loader.counted_batch_size)",
    )
    samples: int = _field(5, "samples in the epoch that starts, -1 unknown")

    @classmethod
    def of(
        cls, iterator: Any, loader: int, settings: LoaderInfo | None, batch_size: int, samples: int
    ) -> IteratorStarted:
        return cls((ITERATOR_STARTED, iterator, loader, settings, batch_size, samples))


#: Announces an iterator whose fetch the segmenter meets while it does not know it, or while
#: its batch count has fallen (a new epoch, or a new iterator that took a dead one's id):
#: called with the iterator and its :class:`~.events.EpochStarted` fields ``(samples,
#: driver)`` when one was logged for it since, else None (it started before the run); returns
#: the :class:`~.events.IteratorStarted` to apply before the fetch.
Announcer = Callable[[Any, "tuple[int, str | None] | None"], IteratorStarted]


class Phase(_Event):
    """A part of a step the phase instruments saw from its start to its end
    (:mod:`traceml_nb.engine.instrument.step_phases`): logged when it ends, so a phase nested
    in another (a forward recomputed inside the backward) is part of the outer one and logs
    nothing of its own; an optimizer's step is logged in pieces around its closure's phases
    (:class:`~traceml_nb.engine.instrument.phase_clock.PhaseClock`)."""

    __slots__ = ()
    _fields = ("phase", "t_start_ns", "t_end_ns", "gpu_start", "gpu_end")
    phase: int = _field(1, "FORWARD, BACKWARD, OPTIMIZER, SETUP or BEFORE_CLOSURE")
    t_start_ns: int = _field(2, "when it started")
    t_end_ns: int = _field(3, "when it ended")
    gpu_start: EventLike | None = _field(
        4, "CUDA event recorded at its start (None off CUDA, or if it failed)"
    )
    gpu_end: EventLike | None = _field(5, "CUDA event recorded at its end")


class Sampling(_Event):
    """The phase instruments were turned on or off: a step that begins while they are on has
    its phases timed, the others have none."""

    __slots__ = ()
    _fields = ("on",)
    on: bool = _field(1, "on from now, or off")


Event = (
    Fetch | Exhausted | OptimizerStep | Marker | EpochStarted | IteratorStarted | Phase | Sampling
)

_TYPES: tuple[type[_Event], ...] = (
    Fetch,
    Exhausted,
    OptimizerStep,
    Marker,
    EpochStarted,
    IteratorStarted,
    Phase,
    Sampling,
)


def typed(logged: tuple[Any, ...]) -> Event:
    """The typed event of a logged tuple (its kind is its first item)."""
    return _TYPES[logged[0]](logged)  # type: ignore[return-value]
