"""The rows of the steps a loop marks itself (``traceml_nb.step()``, ``run.step()``), as the
step segmenter (:mod:`traceml_nb.engine.segment`) makes them: one from each marker to the next,
with the data wait and the phases between."""

from __future__ import annotations

from .open_steps import Row
from .phase_ledger import Mark, PhaseLedger
from .record import SOURCE_MARKER


class MarkerRows:
    """The markers of one run: where the last one was, the run's data wait and the phase totals
    then."""

    __slots__ = ("_phases", "_t0", "prev_ns", "wait_mark", "phase_mark")

    def __init__(self, phases: PhaseLedger, t0: int) -> None:
        self._phases = phases
        self._t0 = t0
        self.prev_ns = 0  #: the previous marker (0: none yet)
        self.wait_mark = 0  #: the run's data wait at it, ns
        self.phase_mark: Mark = ()  #: the phase totals at it, () when it was not sampled

    def marked(self, t_ns: int, wait_total: int, batch: int) -> Row:
        """The row from the previous marker (or the run's start) to this one at ``t_ns``, the
        run's data wait so far ``wait_total``, of the batch fetched last (``batch`` samples)."""
        start = self.prev_ns or self._t0
        wait = wait_total - self.wait_mark
        phases = self._phases.of_step(self.phase_mark) if self.phase_mark else None
        self.prev_ns, self.wait_mark = t_ns, wait_total
        self.phase_mark = self._phases.mark()
        return (start - self._t0, t_ns - start, wait, batch, SOURCE_MARKER, 0), phases, -1

    def still_timed(self) -> None:
        """An optimizer step ran: the phase totals marked go on only where still timed."""
        self.phase_mark = self._phases.still_timed(self.phase_mark)
