"""``analyze``: record → summary → diagnosis, one pure function; :class:`Analysis`, what it
returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine.capabilities import Capabilities
from ..engine.record import RecordSnapshot, RunRecord
from .diagnosis import diagnose
from .findings import Diagnosis, Finding, Summary
from .profile_summary import (
    PROFILE_SUGGESTION,
    SUGGESTED_PROFILE_STEPS,
    ProfileSummary,
    profile_cause,
    suggests_profile,
    summarize_profile,
)
from .step_blocks import block_means
from .steps import StepSelection
from .summary import measure, summarize
from .warmup import WarmupSpec


@dataclass
class Analysis:
    """The summary and the diagnosis of one run, with what they were computed from (not
    serialised): ``selection``, the run's steps (:class:`~.steps.StepSelection`), and
    ``steady_step_ms``, the steady steps' times (ms, in step order; the means of blocks of
    ``summary.step_block`` steps where that is more than 1) for comparisons."""

    summary: Summary
    diagnosis: Diagnosis
    selection: StepSelection | None = field(default=None, repr=False, compare=False)
    steady_step_ms: np.ndarray | None = field(default=None, repr=False, compare=False)
    #: the ``--profile`` capture's summary (None: not asked)
    profile: ProfileSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "summary": self.summary.to_dict(),
            "diagnosis": self.diagnosis.to_dict(),
        }
        if self.profile is not None:
            out["profile"] = self.profile.to_dict()
        return out


def analyze(
    record: RecordSnapshot | RunRecord,
    capabilities: Capabilities,
    *,
    warmup: WarmupSpec = "auto",
    cpus_available: int | None = None,
) -> Analysis:
    """Summarise and diagnose a run's record (a snapshot of it, or the record itself, of which
    a snapshot is taken); works on a run that is still measuring too.

    ``warmup``: ``"auto"`` or the number of leading steps to exclude. ``cpus_available``: CPUs
    the training process may use (default: the host sampler's reading, else the affinity mask).
    """
    snapshot = record.snapshot() if isinstance(record, RunRecord) else record
    m = measure(snapshot, capabilities, warmup, cpus_available)
    summary = summarize(snapshot, m)
    diagnosis = diagnose(summary, m, capabilities)
    profile = summarize_profile(snapshot.profile, m.selection, bool(snapshot.loaders))
    if profile is not None and profile.captured:
        diagnosis.profiled_cause = profile_cause(profile, diagnosis.verdict)
    elif profile is None and suggests_profile(summary, diagnosis.verdict, diagnosis.confidence):
        diagnosis.advice.append(Finding(PROFILE_SUGGESTION, {"steps": SUGGESTED_PROFILE_STEPS}))
    steady = block_means(m.wall_ms, summary.step_block)
    return Analysis(summary, diagnosis, m.selection, steady, profile)
