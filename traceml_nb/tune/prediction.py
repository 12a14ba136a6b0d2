"""What a tuning predicted for a rerun, beside what the rerun measured.

``%traceml tune`` of a run predicts a step time for each loader setting it measured; when the
cell runs again with one of those settings, :func:`prediction_for` finds the tuning and makes a
:class:`Prediction` of the rerun: the step time predicted and measured (ms), and, because the
prediction assumed the tuned run's compute time per step, that compute and the rerun's, with the
prediction made again for the rerun's compute. The session puts it on the rerun's comparison
with its previous run; :mod:`traceml_nb.views.comparison_words` writes it beside that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .constants import COMPUTE_CHANGE_SHARE
from .predict import TuneResult, predict_for_compute_ms
from .recorded_run import RecordedRun


@dataclass(frozen=True)
class Prediction:
    """A tuning's prediction for a rerun's loader settings, and what the rerun measured."""

    tuned_run: str  #: the tuned run, as the history labels it (``#1 quickstart``)
    candidate: str  #: the loader setting, as the tuning labels it (``1 worker, prefetch 2``)
    recommended: bool  #: whether it was the tuning's recommendation
    predicted_ms: float  #: the step time the tuning predicted, ms
    measured_ms: float  #: the rerun's median step time, ms
    tuned_compute_ms: float | None = None  #: the compute per step the prediction assumed, ms
    compute_ms: float | None = None  #: the rerun's compute per step, ms (None: unknown)
    #: the prediction made again for the rerun's compute, ms (None: either compute unknown)
    predicted_for_compute_ms: float | None = None

    @property
    def error_share(self) -> float:
        """Measured over predicted, less 1 (``-0.08``: 8% faster than predicted)."""
        return self.measured_ms / self.predicted_ms - 1

    @property
    def compute_change(self) -> float | None:
        """The rerun's compute per step over the tuned run's, less 1; None where unknown."""
        if not self.tuned_compute_ms or self.compute_ms is None:
            return None
        return self.compute_ms / self.tuned_compute_ms - 1

    @property
    def compute_changed(self) -> bool:
        """Whether the model's own compute moved by more than ``COMPUTE_CHANGE_SHARE``."""
        change = self.compute_change
        return change is not None and abs(change) > COMPUTE_CHANGE_SHARE

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_share": self.error_share}


def prediction_for(
    entry: RecordedRun, tunings: Sequence[TuneResult], earlier: Sequence[RecordedRun]
) -> Prediction | None:
    """What the latest tuning of one of ``earlier`` (the runs of ``entry``'s cell before it)
    predicted for ``entry``'s loader settings, the recommended candidate first; None when no
    tuning measured them."""
    from .candidates import same_settings
    from .find import training_loader_info

    info = training_loader_info(entry.loaders)
    measured = entry.summary.step_ms_median
    if info is None or measured is None:
        return None
    for tuning in reversed(tunings):
        tuned = tuning.cell_entry
        if tuned is None or not any(e is tuned for e in earlier):
            continue
        ordered = sorted(tuning.measurements, key=lambda m: m.candidate != tuning.recommended)
        for m in ordered:
            if m.predicted_ms is not None and same_settings(m.candidate, info):
                compute = entry.summary.compute_ms_median
                again = None
                if tuning.compute_ms and compute is not None:
                    cpus = entry.summary.cpus_available
                    again = predict_for_compute_ms(m, tuning.compute_ms, compute, cpus)
                return Prediction(
                    tuned_run=tuned.label,
                    candidate=m.candidate.label,
                    recommended=m.candidate == tuning.recommended,
                    predicted_ms=m.predicted_ms,
                    measured_ms=measured,
                    tuned_compute_ms=tuning.compute_ms,
                    compute_ms=compute,
                    predicted_for_compute_ms=again,
                )
    return None
