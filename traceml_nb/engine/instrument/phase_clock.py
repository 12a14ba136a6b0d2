"""The phase open on the training thread: :class:`PhaseClock` logs a
:class:`~traceml_nb.engine.events.Phase` for each outermost pair of :meth:`~PhaseClock.start`
and :meth:`~PhaseClock.end`, on the tracer's clock (and on CUDA with an event at each end); an
optimizer's step is logged in pieces around the forwards and backwards of its closure; the
hooks put in place at a model's call are logged as a ``SETUP`` (:meth:`PhaseClock.set_up`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..events import BEFORE_CLOSURE, OPTIMIZER, PHASE, SETUP, EventLike
from .compilation import compiling_check


class PhaseClock:
    """The phase open on the training thread, nested calls counted: :meth:`start` and :meth:`end`
    come in pairs; the outermost pair logs one :class:`~traceml_nb.engine.events.Phase`. With
    ``gpu_mark`` (on CUDA: the stall timer's :meth:`~.gpu_events.GpuStallTimer.mark`, which
    records a pooled event on the user's stream and returns it, None if that failed) the
    outermost pair also records a CUDA event at each end, for the phase's GPU time.

    A forward or backward that starts directly inside an optimizer's step is its closure's
    (``optimizer.step(closure)``: LBFGS, PyTorch Lightning's every step): the step's time so far
    is logged (the first time in a step as ``BEFORE_CLOSURE``, which the ledger tells apart),
    the closure's phase is logged as its own, and the step's time goes on from its end; so the
    optimizer phase is the update alone, as without a closure. Any other phase inside another
    is the outer one's (a forward recomputed by activation checkpointing is backward)."""

    def __init__(
        self,
        log: list[tuple[Any, ...]],
        clock: Callable[[], int],
        check: Callable[[], None],
        max_log: int,
        gpu_mark: Callable[[], EventLike | None] | None = None,
    ):
        self.log = log
        self.clock = clock
        self.check = check  #: processes the log when it holds over ``max_log`` events
        self.max_log = max_log
        self.gpu_mark = gpu_mark
        self.gpu_start: EventLike | None = None  #: the open phase's start event (None off CUDA)
        self.thread = threading.get_ident()  #: the training thread; -1 once removed
        #: True while ``torch.compile`` traces the call (torch's own check)
        self.compiling = compiling_check()
        self.depth = 0  #: phases open, nested ones included
        self.phase = -1  #: the outermost open phase, -1 when none
        self.t_start = 0
        #: ``(outer, inner)`` of each phase that started while another was open and is timed
        #: as part of it (a forward recomputed inside the backward: ``(BACKWARD, FORWARD)``)
        self.inside: set[tuple[int, int]] = set()
        #: the depth of the open closure's phase inside an optimizer's step, 0 when none
        self.closure_depth = 0
        #: the open optimizer's step has not called its closure yet
        self.before_closure = False

    def start(self, phase: int) -> None:
        if self.compiling() or threading.get_ident() != self.thread:
            return
        if self.depth:
            self.depth += 1
            if self.phase == OPTIMIZER and phase != OPTIMIZER:
                # the step so far; its closure's phase opens
                self._log_open(BEFORE_CLOSURE if self.before_closure else OPTIMIZER)
                self.before_closure = False
                self.closure_depth = self.depth
                self._open(phase)
            else:
                self.inside.add((self.phase, phase))
            return
        self.depth = 1
        self.before_closure = phase == OPTIMIZER
        self._open(phase)

    def end(self) -> None:
        if self.compiling() or threading.get_ident() != self.thread or not self.depth:
            return
        self.depth -= 1
        if not self.depth:
            self._log_open(self.phase)
            self.phase = -1
            self.gpu_start = None
        elif self.depth == self.closure_depth - 1:
            self._log_open(self.phase)  # the closure's phase; the optimizer's step goes on
            self.closure_depth = 0
            self._open(OPTIMIZER)

    def set_up(self, t_start: int) -> None:
        """Log the instruments put in place from ``t_start`` (this clock's ns) to now, where no
        phase is open (a :data:`~traceml_nb.engine.events.SETUP`: it ends the input copy and
        is timed as no phase)."""
        if self.depth or threading.get_ident() != self.thread:
            return
        self._log((PHASE, SETUP, t_start, self.clock(), None, None))

    def reset(self) -> None:
        """No phase open (the instruments were taken away mid-phase)."""
        self.depth = 0
        self.phase = -1
        self.gpu_start = None
        self.closure_depth = 0
        self.before_closure = False

    def _open(self, phase: int) -> None:
        self.phase = phase
        if self.gpu_mark is not None:
            self.gpu_start = self.gpu_mark()
        self.t_start = self.clock()

    def _log_open(self, phase: int) -> None:
        """Log the open phase's time, from its start to now, as ``phase``."""
        t_end = self.clock()
        gpu_end = self.gpu_mark() if self.gpu_mark is not None else None
        self._log((PHASE, phase, self.t_start, t_end, self.gpu_start, gpu_end))

    def _log(self, event: tuple[Any, ...]) -> None:
        log = self.log
        log.append(event)
        if len(log) > self.max_log:  # a loop with neither a DataLoader nor an optimizer
            self.check()
