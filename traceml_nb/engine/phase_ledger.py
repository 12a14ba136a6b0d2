"""The step segmenter's account of the phases (:mod:`traceml_nb.engine.segment`): running totals
of the input copy, forward, backward and optimizer time the phase instruments logged
(:class:`~traceml_nb.engine.events.Phase`), whether they are on
(:class:`~traceml_nb.engine.events.Sampling`), and for each step a mark taken when it began,
from which its phases are told when it ends.

Pure and torch-free. A step gets phases when it began while the instruments were on, unless an
optimizer step other than the one that turned them off ran in it after they had been off (even
if they were on again by then: part of it was not timed).

On CUDA each phase also carries two events (its start and end on the user's stream), read only
once the GPU is past them: the ledger keeps the phases' events in order, each with a sequence
number, until a step that ends claims those logged since it began (:meth:`gpu_of_step`); the
others are let go of.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .events import BEFORE_CLOSURE, FORWARD, OPTIMIZER, SETUP, EventLike, Phase, Sampling
from .step_table import PHASE_WIDTH

#: A step's mark: the totals when it began, the times the instruments had been turned off and
#: the GPU phases logged so far; () for a step that began with them off.
Mark = tuple[int, ...]
#: A phase's events: ``(phase, start event, end event)``.
GpuPhase = tuple[int, EventLike, EventLike]
#: The step segmenter's GPU sink receives, each time rows are written, the steps closed since
#: the last time whose fetches carried CUDA events, as ``(row, gpu_enter, gpu_exit,
#: next_gpu_enter, gpu_phases)`` (the step's phases' events, :meth:`PhaseLedger.gpu_of_step`,
#: or None), and the events the segmenter let go of since (it hands none of them to a later
#: step: the events of a step closed without all three of its own, of an exhausting fetch, of
#: a fetch it does not count, of phases no step claimed), each as ``(k, event)``: it was let
#: go of after the first ``k`` of those steps were closed, and no later one holds it. A step
#: handed on takes its own ``gpu_enter`` and ``gpu_exit`` with it: the previous step, which
#: holds its ``gpu_enter`` as its next, is handed on before it, so the sink frees both once
#: it has read the step.
GpuStep = tuple[int, EventLike, EventLike, EventLike, tuple[GpuPhase, ...] | None]
GpuSink = Callable[[list[GpuStep], list[tuple[int, EventLike]]], None]


class PhaseLedger:
    """The totals and the rules above; the segmenter feeds it the events in order."""

    def __init__(self) -> None:
        #: copy, forward, backward and optimizer time so far (the record's PHASE_COLUMNS), ns
        self.totals = [0] * PHASE_WIDTH
        self.sampling = False  #: the instruments are on: a step that begins gets a mark
        #: off, by the optimizer step whose end comes next; the segmenter sets it False once it
        #: has looked at every open step's mark at that step (:meth:`still_timed`)
        self.turned_off = False
        self._offs = 0  #: times they were turned off
        #: the last fetch's return, until a forward starts after it (:meth:`arrived`: the
        #: input copy runs from there to the next forward's start), and the time of the phases
        #: timed since, which the copy leaves out, ns
        self.copy_from = -1
        self.copy_between = 0
        #: the phases' CUDA events no step claimed yet, ``(sequence number, *GpuPhase)``
        self._gpu: list[tuple[int, int, EventLike, EventLike]] = []
        self._gpu_seq = 0  #: GPU phases logged so far

    def mark(self) -> Mark:
        """The mark of a step that begins now."""
        return (*self.totals, self._offs, self._gpu_seq) if self.sampling else ()

    def arrived(self, t_exit: int) -> None:
        """A fetch returned its batch at ``t_exit``: the input copy runs from there."""
        self.copy_from = t_exit
        self.copy_between = 0

    def phase(self, ev: Phase) -> None:
        """Add a phase to the totals. The input copy runs from the last fetch's return to the
        next forward (or ``SETUP``), less the phases timed in between (an update of the last
        accumulation cycle made once the next batch has come); none where no forward comes
        (a compiled model's, unseen: the copy is unavailable then). An optimizer's step
        before its closure's first phase is in the copy where no forward ran since that fetch
        (the closure's way to the model), else the update's."""
        _, phase, t_start, t_end, gpu_start, gpu_end = ev
        totals = self.totals
        copying = self.copy_from >= 0
        if phase == BEFORE_CLOSURE:
            if copying:  # (its events are let go of: the GPU copy runs on through it)
                self._gpu_phase(phase, gpu_start, gpu_end)
                return
            phase = OPTIMIZER
        if phase in (FORWARD, SETUP):
            if copying:
                totals[0] += max(0, t_start - self.copy_from - self.copy_between)
                self.copy_from = -1
            if phase == SETUP:
                return  # our instruments' time: no phase of the step
        elif copying:
            self.copy_between += t_end - t_start
        totals[phase + 1] += t_end - t_start
        self._gpu_phase(phase, gpu_start, gpu_end)

    def _gpu_phase(self, phase: int, gpu_start: Any, gpu_end: Any) -> None:
        """Keep a phase's CUDA events (None: off CUDA, or the event failed) for its step."""
        if gpu_start is not None or gpu_end is not None:
            self._gpu.append((self._gpu_seq, phase, gpu_start, gpu_end))
            self._gpu_seq += 1

    def turned(self, ev: Sampling) -> None:
        self.sampling = ev[1]
        self.turned_off = not self.sampling
        # an input copy begins at a fetch seen while the instruments are on (a fetch before a
        # sample, which no forward timed followed, would run to the sample's first forward)
        self.copy_from = -1
        if not self.sampling:
            self._offs += 1

    def still_timed(self, mark: Mark) -> Mark:
        """At an optimizer step, the mark of a step still open: () once part of it went
        untimed (set :attr:`turned_off` False after every open step's mark was looked at)."""
        if mark and not self.turned_off and mark[PHASE_WIDTH] != self._offs:
            return ()
        return mark

    def of_step(self, mark: Mark) -> tuple[int, int, int, int] | None:
        """The phases of a step that ends now, begun with ``mark`` (None: it has none)."""
        if not mark:
            return None
        copy, forward, backward, optimizer = self.totals
        return (copy - mark[0], forward - mark[1], backward - mark[2], optimizer - mark[3])

    @property
    def gpu_pending(self) -> bool:
        """Phases' CUDA events wait to be claimed or let go of."""
        return bool(self._gpu)

    def gpu_of_step(self, mark: Mark) -> tuple[tuple[GpuPhase, ...] | None, list[EventLike]]:
        """At the end of a step begun with ``mark``: ``(its GPU phases, the events no step will
        read)``. The step claims the phases logged since it began, if it has phases and each of
        them has both events (else None); every other event waiting is let go of. ``mark`` ()
        lets go of them all."""
        waiting, self._gpu = self._gpu, []
        if not waiting:
            return None, []
        first = mark[PHASE_WIDTH + 1] if mark else self._gpu_seq
        claimed = tuple((p, s, e) for seq, p, s, e in waiting if seq >= first)
        whole = bool(claimed) and all(s is not None and e is not None for _, s, e in claimed)
        kept = claimed if whole else ()
        gone = [
            ev
            for seq, p, s, e in waiting
            if not (kept and seq >= first)
            for ev in (s, e)
            if ev is not None
        ]
        return (kept or None), gone
