"""What the live header says about a run while it goes on, from the analysis of the rows the
chart shows.

Until the analysis has enough steady steps to judge (``MIN_STEADY_STEPS``) the header says so
in words ("collecting: 6 steps so far, a verdict after 10 steady steps") rather than a
verdict. After that it shows the verdict so far, and a new verdict replaces the shown one only
once the analysis has given it :data:`CONFIRMATIONS` times in a row: a run whose evidence sits
near a threshold does not flip from one tick to the next, while a run that really changes
(an input pipeline that starts to lag) is followed within a few seconds.
"""

from __future__ import annotations

from ...analysis.formatting import plural
from ...analysis.pipeline import Analysis
from ...analysis.thresholds import MIN_STEADY_STEPS
from ..diagnosis_words import sentence

#: Consecutive analyses that must agree on a new verdict before the header shows it.
CONFIRMATIONS = 2


def collecting_text(steps: int) -> str:
    """What the header says before there is a verdict."""
    return (
        f"collecting: {plural(steps, 'step')} so far, a verdict after "
        f"{plural(MIN_STEADY_STEPS, 'steady step')}"
    )


class RunningVerdict:
    """The verdict the header shows, updated from each analysis of the run so far."""

    def __init__(self, confirmations: int = CONFIRMATIONS) -> None:
        self.confirmations = confirmations
        self.shown: str | None = None  #: the verdict shown (``Diagnosis.verdict``)
        self.title: str | None = None  #: its title, in words
        self._candidate: tuple[str, str] | None = None
        self._seen = 0
        #: the run's MFU (0..1) once its FLOPs were counted on a GPU whose peak is known
        self.mfu: float | None = None
        #: the MFU is a lower bound: operators without a FLOP formula ran (``uncounted_ops``)
        self.mfu_at_least = False

    def update(self, analysis: Analysis, *, final: bool = False) -> None:
        """Take the analysis of the rows now; ``final``: the run has ended (shown at once)."""
        d = analysis.diagnosis
        if analysis.summary.mfu is not None:
            self.mfu = analysis.summary.mfu
            self.mfu_at_least = bool(analysis.summary.uncounted_ops)
        if analysis.summary.steady_steps < MIN_STEADY_STEPS and not final:
            return  # not a verdict yet: the header keeps collecting (or its verdict so far)
        if final or self.shown is None or d.verdict == self.shown:
            self._show(d.verdict, sentence(d.title))
            return
        candidate = (d.verdict, sentence(d.title))
        if self._candidate is not None and self._candidate[0] == d.verdict:
            self._seen += 1
        else:
            self._candidate, self._seen = candidate, 1
        if self._seen >= self.confirmations:
            self._show(*candidate)

    def _show(self, verdict: str, title: str) -> None:
        self.shown, self.title = verdict, title
        self._candidate, self._seen = None, 0

    def text(self, steps: int, *, running: bool) -> str:
        """The header's verdict part for a run with ``steps`` steps so far."""
        if self.title is None:
            return collecting_text(steps) if running else ""
        return f"{'verdict so far' if running else 'verdict'}: {self.title}"
