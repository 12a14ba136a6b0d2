"""The analysis results: plain data, JSON-able, shared by the report, the history and ``-o``.

Units are in the field names (``_ms``, ``_s``, ``_mb``, ``_share`` = fraction 0..1,
``_pct`` = percent 0..100). ``None`` means unavailable; the reason is in ``unavailable``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..contracts import Confidence, StepSource, Verdict


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    """Build dataclass ``cls`` from ``data``, ignoring unknown keys (forward compatible)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class PhaseSummary:
    """A phase other than the measured steps (an eval loader, an extra loader)."""

    name: str  #: e.g. "eval (loader 1)", "eval (loaders 1–4)"
    batches: int
    total_s: float  #: time away from training the phase took, s
    data_wait_share: float | None
    slot: int | None = None  #: the phase's (first) loader
    #: of ``batches`` and ``total_s``, what came before the run's first optimizer step (a
    #: trainer's sanity check of its validation loader)
    before_training_batches: int = 0
    before_training_s: float = 0.0


@dataclass
class Summary:
    """Steady-state statistics of one run (warm-up steps excluded, reported separately)."""

    step_source: StepSource
    total_steps: int  #: every step the loop made
    warmup_steps: int  #: leading steps excluded as warm-up / compile
    steady_steps: int  #: the steps the statistics are about
    elapsed_s: float  #: wall time of the run
    warmup_s: float  #: wall time of the warm-up steps
    step_ms_median: float | None
    step_ms_p10: float | None
    step_ms_p90: float | None
    step_ms_mean: float | None
    data_wait_ms_median: float | None
    compute_ms_median: float | None
    data_wait_share: float | None  #: sum(data wait) / sum(step time), steady steps
    first_fetch_ms: float | None  #: first batch of the run (worker start-up)
    batch_size: int | None  #: median batch size
    samples_per_s: float | None
    steps_per_s: float | None
    gpu_stall_share: float | None  #: sum(GPU input stall) / sum(step time), CUDA events
    gpu_util_median_pct: float | None  #: NVML, during the steady steps
    gpu_mem_peak_mb: float | None
    gpu_mem_total_mb: float | None
    process_cpu_median_pct: float | None  #: main process, 100 = one core
    workers_cpu_median_pct: float | None  #: DataLoader workers, summed, 100 = one core
    system_cpu_median_pct: float | None  #: whole machine, 0..100
    cpus_available: int | None
    phases: list[PhaseSummary] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  #: metric -> why
    #: steps an evaluation ran inside: counted, but left out of the statistics (their time is
    #: the evaluation's too)
    interleaved_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        obj = _from_dict(cls, data)
        obj.phases = [
            p if isinstance(p, PhaseSummary) else _from_dict(PhaseSummary, p) for p in obj.phases
        ]
        return obj


@dataclass
class Evidence:
    """One number behind a verdict, e.g. ``Evidence("data wait", 0.44, "44% of step time")``."""

    label: str
    value: float | None
    text: str  #: the value as shown, or "unavailable (why)"


@dataclass
class Diagnosis:
    """The verdict on a run, with its evidence and the concrete fix."""

    verdict: Verdict
    title: str  #: one line for humans
    confidence: Confidence
    cause: str | None = None  #: sub-cause, e.g. "too few DataLoader workers"
    evidence: list[Evidence] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)  #: concrete changes, from the user's loader
    wont_help: list[str] = field(default_factory=list)  #: what will not help, and why
    saving_bound_share: float | None = (
        None  #: fixing the cause saves at most this share of wall time
    )
    saving_text: str | None = None
    secondary: list[str] = field(
        default_factory=list
    )  #: other findings (memory pressure, throttling)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        obj = _from_dict(cls, data)
        obj.evidence = [
            e if isinstance(e, Evidence) else _from_dict(Evidence, e) for e in obj.evidence
        ]
        return obj


@dataclass
class Analysis:
    """The summary and the diagnosis of one run, with what they were computed from (not
    serialised): ``selection``, the run's steps (:class:`~.steps.StepSelection`), and
    ``steady_step_ms``, the steady steps' times (ms, in step order) for comparisons."""

    summary: Summary
    diagnosis: Diagnosis
    selection: Any = field(default=None, repr=False, compare=False)
    steady_step_ms: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary.to_dict(), "diagnosis": self.diagnosis.to_dict()}
