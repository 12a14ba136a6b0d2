"""What IPython displays: the final report, ``%traceml history`` and ``%traceml compare``.

Each is one display object with an HTML and a ``text/plain`` version (:mod:`.html`,
:mod:`.text`): the saved notebook keeps both, so the report reads the same in JupyterLab, on
GitHub, in nbviewer and in a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.comparison import Comparison
from ..analysis.findings import Diagnosis
from ..session.history import History
from ..session.result import OWN_PHASES, RunResult
from .diagnosis_words import DiagnosisWords, diagnosis_words
from .history_table import NO_RUNS, history_cells, history_table, history_text
from .html import compare_html, history_html, render_html
from .report_content import ReportContent, RunMeta, StepChart
from .text import render_comparison_text, render_text


class Report(ReportContent):
    """The end-of-run report (see :class:`~.model.ReportContent` for what it holds)."""

    @classmethod
    def of(cls, result: RunResult) -> Report:
        """The report of an analysed run."""
        steps = result.steps
        measured = [i for i, phase in enumerate(steps.phase) if phase in OWN_PHASES]
        chart = StepChart(
            wall_ms=[steps.wall_ms[i] for i in measured],
            data_wait_ms=[steps.data_wait_ms[i] for i in measured],
            warmup_steps=result.summary.warmup_steps,
        )
        meta = RunMeta(
            result.name, result.status, result.error, result.elapsed_s, result.device, result.run_id
        )
        from ..analysis.cost import cost_sentence

        return cls(
            meta,
            result.analysis,
            result.capabilities,
            list(result.comparisons),
            chart,
            list(result.capabilities.notes),
            cost_sentence(getattr(result, "cost", None)),
            getattr(result, "profile", None),
            getattr(result, "ranks", None),
            result.job_line() if hasattr(result, "job_line") else None,
        )

    def _repr_html_(self) -> str:
        return render_html(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(render_text(self))

    def __repr__(self) -> str:
        return render_text(self)


class ReportRenderer:
    """The report as a session asks for it (:class:`~traceml_nb.session.result.Renderer`): the
    plain text a result prints as, and the static HTML the trackers attach."""

    def text(self, result: RunResult) -> str:
        return render_text(Report.of(result))

    def html(self, result: RunResult) -> str:
        return render_html(Report.of(result))

    def diagnosis_words(self, diagnosis: Diagnosis) -> DiagnosisWords:
        return diagnosis_words(diagnosis)


@dataclass
class HistoryTable:
    """``%traceml history``: ``rows`` (:func:`.history.history_table`) as HTML, ``text`` as
    plain text."""

    rows: list[dict[str, Any]]
    text: str

    @classmethod
    def of(cls, history: History) -> HistoryTable:
        return cls(history_table(history), history_text(history))

    def _repr_html_(self) -> str:
        return history_html([history_cells(row) for row in self.rows], self.text or NO_RUNS)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)

    def __repr__(self) -> str:
        return self.text


@dataclass
class ComparisonView:
    """``%traceml compare A B``: run ``after`` against run ``before``."""

    before_label: str  #: e.g. "#1 baseline"
    after_label: str
    comparison: Comparison

    @property
    def title(self) -> str:
        return f"{self.after_label} vs {self.before_label}"

    def _repr_html_(self) -> str:
        return compare_html(self.title, self.comparison)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))

    def __repr__(self) -> str:
        return render_comparison_text(self.title, self.comparison)
