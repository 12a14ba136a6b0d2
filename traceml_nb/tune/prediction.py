"""What a tuning predicted for a rerun, beside what the rerun measured.

``%traceml tune`` of a run predicts a step time for each loader setting it measured; when the
cell runs again with one of those settings, :func:`prediction_for` finds the tuning and makes a
:class:`Prediction` of the rerun: the step time predicted and measured (ms), and, because the
prediction assumed the tuned run's compute time per step, that compute and the rerun's, with the
prediction made again for the rerun's compute. :func:`prediction_rows` and
:func:`prediction_sentence` put it beside the rerun's comparison with its previous run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .constants import COMPUTE_CHANGE_SHARE


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


def prediction_for(entry: Any, tunings: Sequence[Any], earlier: Sequence[Any]) -> Prediction | None:
    """What the latest tuning of one of ``earlier`` (the runs of ``entry``'s cell before it,
    :class:`~traceml_nb.session.history.RunEntry`) predicted for ``entry``'s loader settings,
    the recommended candidate first; None when no tuning measured them."""
    from .candidates import same_settings
    from .find import training_loader_info
    from .predict import predict_for_compute_ms

    info = training_loader_info(entry.loaders)
    measured = entry.summary.step_ms_median
    if info is None or measured is None:
        return None
    for tuning in reversed(tunings):
        tuned = getattr(tuning, "cell_entry", None)
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


def prediction_rows(prediction: Prediction) -> list[Any]:
    """The comparison rows that put the prediction beside the measured step time, and where
    the model's own compute changed by more than ``COMPUTE_CHANGE_SHARE``, the prediction made
    again for the rerun's compute."""
    from ..analysis.comparison import NEUTRAL, ComparisonRow
    from ..analysis.formatting import fmt_ms, signed_pct

    measured = prediction.measured_ms
    rows = [
        ComparisonRow(
            f"step time predicted by %traceml tune of {prediction.tuned_run}",
            fmt_ms(prediction.predicted_ms),
            fmt_ms(measured),
            signed_pct(prediction.error_share),
            NEUTRAL,
        )
    ]
    again = prediction.predicted_for_compute_ms
    if prediction.compute_changed and again and prediction.compute_ms is not None:
        rows.append(
            ComparisonRow(
                f"step time predicted for this run's compute ({fmt_ms(prediction.compute_ms)})",
                fmt_ms(again),
                fmt_ms(measured),
                signed_pct(measured / again - 1),
                NEUTRAL,
            )
        )
    return rows


def prediction_sentence(prediction: Prediction) -> str:
    """``%traceml tune of #1 predicted 27.2 ms a step for these settings: measured 28.0 ms
    (+3%)``, and where the model's own compute changed by more than ``COMPUTE_CHANGE_SHARE``,
    by how much (the prediction is for the tuned run's compute) and the prediction made again
    for this run's compute (``: for 26.7 ms it is 29.2 ms (measured −3%)``)."""
    from ..analysis.formatting import fmt_ms, signed_pct

    sentence = (
        f"%traceml tune of {prediction.tuned_run} predicted {fmt_ms(prediction.predicted_ms)}"
        f" a step for these settings ({prediction.candidate}): measured "
        f"{fmt_ms(prediction.measured_ms)} ({signed_pct(prediction.error_share)})"
    )
    change = prediction.compute_change
    tuned_ms, now_ms = prediction.tuned_compute_ms, prediction.compute_ms
    if prediction.compute_changed and change is not None and tuned_ms and now_ms is not None:
        tuned, now = fmt_ms(tuned_ms), fmt_ms(now_ms)
        sentence += (
            f"; the model's own compute changed too ({tuned} \u2192 {now} a step, "
            f"{signed_pct(change)}), and the prediction was for {tuned}"
        )
        again = prediction.predicted_for_compute_ms
        if again:
            error = prediction.measured_ms / again - 1
            sentence += f": for {now} it is {fmt_ms(again)} (measured {signed_pct(error)})"
    return sentence
