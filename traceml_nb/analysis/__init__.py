"""Pure analysis of a run record: summary, warm-up, diagnosis, comparison of runs.

Nothing here touches torch, threads or the display; every function takes plain data and returns
the dataclasses of :mod:`traceml_nb.analysis.findings`.
"""

from __future__ import annotations

from ..engine.contracts import VERDICTS
from .comparison import Comparison, ComparisonRow, compare
from .findings import Diagnosis, Evidence, PhaseSummary, Summary
from .pipeline import Analysis, analyze
from .steps import select_steps, step_rule
from .warmup import detect_warmup

__all__ = [
    "VERDICTS",
    "Analysis",
    "Comparison",
    "ComparisonRow",
    "Diagnosis",
    "Evidence",
    "PhaseSummary",
    "Summary",
    "analyze",
    "compare",
    "detect_warmup",
    "select_steps",
    "step_rule",
]
