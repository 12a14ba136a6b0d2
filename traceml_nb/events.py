"""What the instruments log on the training thread, in order: one event per DataLoader fetch,
optimizer step and marker. The step segmenter (:mod:`traceml_nb.segment`) turns them into step
rows later, off the hot path.

Times are ``time.perf_counter_ns()`` values. Iterators and optimizers are named by ``id()``:
an id is only reused once its object is gone, and an iterator's first fetch is always
announced by an :class:`IteratorStarted`, so a reused id starts afresh.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .record import LoaderInfo


class IteratorStarted(NamedTuple):
    """A DataLoader iterator the segmenter has not seen yet, or one starting a new epoch
    (persistent workers restart the same iterator); logged just before its :class:`Fetch`."""

    iterator: int  #: ``id()`` of the iterator
    loader: int  #: ``id()`` of the loader's batch sampler, the same across epochs
    #: the loader's settings, the first time this loader is seen (else None)
    settings: LoaderInfo | None


class Fetch(NamedTuple):
    """A batch returned by a DataLoader iterator's ``__next__``."""

    iterator: int  #: ``id()`` of the iterator
    number: int  #: batches the iterator has yielded in this epoch, this one included (1 = first)
    t_enter_ns: int  #: when ``__next__`` was entered
    t_exit_ns: int  #: when it returned the batch
    batch: int  #: samples in the batch, -1 when they could not be read
    gpu_enter: Any = None  #: CUDA event recorded at the entry (None off CUDA)
    gpu_exit: Any = None  #: CUDA event recorded at the exit


class Exhausted(NamedTuple):
    """``__next__`` raised ``StopIteration``: the iterator's epoch is over."""

    iterator: int
    t_enter_ns: int
    gpu_enter: Any = None


class OptimizerStep(NamedTuple):
    """An ``optimizer.step()`` has returned."""

    optimizer: int  #: ``id()`` of the optimizer
    t_ns: int


class Marker(NamedTuple):
    """An explicit end of a step: ``traceml_nb.step()``."""

    t_ns: int


Event = IteratorStarted | Fetch | Exhausted | OptimizerStep | Marker
