"""The data the views show: plain dataclasses, no rendering (that is :mod:`.text`, :mod:`.html`
and :mod:`.chart`), so every renderer imports them and none imports another's display object."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.pipeline import Analysis
from ..analysis.profile_summary import ProfileSummary
from ..analysis.stragglers import RanksSummary
from ..engine.capabilities import Capabilities
from ..session.result import LabelledComparison

__all__ = ["LabelledComparison", "ReportContent", "RunMeta", "StepChart"]


@dataclass
class RunMeta:
    """Facts about the run itself (not measurements)."""

    name: str
    status: str  #: "completed", "failed" or "interrupted"
    error: str | None = None  #: "ValueError: boom" for a failed run
    elapsed_s: float = 0.0  #: wall time of the run, seconds
    device: str = "cpu"  #: "cpu" or "cuda:N"
    run_id: int | None = None  #: number in the session history (``%traceml history``)


@dataclass
class StepChart:
    """Per-step times of the measured phase, in step order, for the static chart.

    ``wall_ms`` is each step's duration and ``data_wait_ms`` the part of it spent waiting for
    the DataLoader, both in milliseconds; the first ``warmup_steps`` steps are warm-up.
    """

    wall_ms: list[float]
    data_wait_ms: list[float]
    warmup_steps: int = 0


@dataclass
class ReportContent:
    """Everything the final report shows."""

    meta: RunMeta
    analysis: Analysis
    capabilities: Capabilities
    comparisons: list[LabelledComparison] = field(default_factory=list)
    chart: StepChart | None = None
    notes: list[str] = field(default_factory=list)
    #: the idle GPU time and its price, one sentence (None: a CPU run)
    cost_text: str | None = None
    #: the ``--profile`` capture's summary (None: no profile was asked for)
    profile: ProfileSummary | None = None
    #: the ranks the run launched, side by side (None: none)
    ranks: RanksSummary | None = None
    #: a rank of a ``torchrun`` job whose report is rank 0's: the one line it shows instead
    job_line: str | None = None
