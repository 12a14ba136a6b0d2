"""``RunResult``: what ``%%traceml -o VAR`` stores, a run's numbers as plain Python data.

It holds the summary, the diagnosis, the comparisons with earlier runs of the cell, the
capabilities, the per-step arrays and the sampler columns, and converts to a dict, JSON or a
pandas DataFrame. A notebook shows it as the report (:mod:`traceml_nb.views.report`).
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Protocol

from ..analysis.comparison import Comparison
from ..analysis.findings import Diagnosis, IdleCost, Summary
from ..analysis.formatting import fmt_ms
from ..analysis.pipeline import Analysis
from ..analysis.profile_summary import ProfileSummary
from ..analysis.steps import StepSelection
from ..analysis.stragglers import RanksSummary
from ..engine.capabilities import Capabilities
from ..engine.contracts import EndStatus
from ..engine.record import FLAG_FLOP_COUNTED, FLAG_INTERLEAVED, FLAG_PROFILED, RecordSnapshot
from ..tune.prediction import Prediction


class DiagnosisText(Protocol):
    """A diagnosis in words (:class:`~traceml_nb.views.diagnosis_words.DiagnosisWords` is one):
    what the trackers log beside the numbers."""

    title: str
    cause: str | None
    advice: list[str]
    wont_help: list[str]
    saving: str | None


class Renderer(Protocol):
    """Writes a result's report: what a :class:`~traceml_nb.session.session.Session` is given
    to print a result (``str(result)``) and to attach it to the trackers; the views layer's
    :class:`~traceml_nb.views.report.ReportRenderer` is one. Passed down, so that this layer
    needs nothing above it."""

    def text(self, result: RunResult) -> str:
        """The plain-text report."""
        ...

    def html(self, result: RunResult) -> str:
        """The static HTML report."""
        ...

    def diagnosis_words(self, diagnosis: Diagnosis) -> DiagnosisText:
        """The diagnosis in words."""
        ...


#: Phase names of the measured steps (other loaders keep their phase name, e.g. "eval (loader 1)").
PHASE_WARMUP = "warmup"
PHASE_TRAIN = "train"
#: a training step an evaluation ran inside (left out of the statistics)
PHASE_INTERLEAVED = "train, evaluation inside"
#: a training step that ran under the profiler (``--profile``; left out of the statistics)
PHASE_PROFILED = "train, profiled"
#: a training step whose FLOPs were counted (left out of the statistics)
PHASE_FLOP_COUNTED = "train, FLOP-counted"
#: the phases of the run's own steps (the other loaders' phases are not steps)
OWN_PHASES = (PHASE_WARMUP, PHASE_TRAIN, PHASE_INTERLEAVED, PHASE_PROFILED, PHASE_FLOP_COUNTED)


@dataclass
class StepArrays:
    """One entry per step, in time order. Times are milliseconds.

    ``wall_ms`` step duration; ``data_wait_ms`` time inside the DataLoader's ``__next__``;
    ``compute_ms`` the rest of the step; ``batch`` batch size (``None`` when it could not be
    read); ``gpu_stall_ms`` GPU input stall from CUDA events (``None`` where unavailable);
    ``phase`` ``"warmup"``/``"train"``/``"train, evaluation inside"``/``"train, profiled"``
    for the run's steps, else the loader's phase name;
    ``start_s`` seconds from the run start to the step's start.
    """

    start_s: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    data_wait_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)
    batch: list[int | None] = field(default_factory=list)
    gpu_stall_ms: list[float | None] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.wall_ms)

    def to_dict(self) -> dict[str, list[Any]]:
        return {name: list(values) for name, values in asdict(self).items()}


def _maybe(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def step_arrays(
    snapshot: RecordSnapshot, selection: StepSelection, warmup_steps: int
) -> StepArrays:
    """The measured steps (the first ``warmup_steps`` of them warm-up) and the steps of the
    other loaders (their phases), in time order.

    Rows that are another segmentation of the same time (optimizer-step rows when the steps
    are DataLoader batches, loader rows inside explicit markers) are left out, so the step
    times never count the same interval twice.
    """
    from ..analysis.steps import phase_rows

    rows: list[tuple[float, float, float, int, float, str]] = []
    interleaved = (selection.flags & FLAG_INTERLEAVED) != 0
    profiled = (selection.flags & FLAG_PROFILED) != 0
    counted = (selection.flags & FLAG_FLOP_COUNTED) != 0
    eligible_seen = 0
    for i in range(len(selection)):
        if interleaved[i]:
            phase = PHASE_INTERLEAVED
        elif profiled[i]:
            phase = PHASE_PROFILED
        elif counted[i]:
            phase = PHASE_FLOP_COUNTED
        else:
            phase = PHASE_WARMUP if eligible_seen < warmup_steps else PHASE_TRAIN
            eligible_seen += 1
        rows.append(
            (
                float(selection.start_s[i]),
                float(selection.wall_ms[i]),
                float(selection.wait_ms[i]),
                int(selection.batch[i]),
                float(selection.gpu_stall_ms[i]),
                phase,
            )
        )
    cols = snapshot.steps
    for name, of_phase in phase_rows(snapshot, selection).items():
        for j in of_phase.nonzero()[0].tolist():
            rows.append(
                (
                    cols.start_ns[j] / 1e9,
                    cols.wall_ns[j] / 1e6,
                    cols.wait_ns[j] / 1e6,
                    cols.batch[j],
                    cols.gpu_stall_ms[j],
                    name,
                )
            )
    rows.sort(key=lambda r: r[0])
    out = StepArrays()
    for start, wall, wait, batch, stall, phase in rows:
        out.start_s.append(start)
        out.wall_ms.append(wall)
        out.data_wait_ms.append(wait)
        out.compute_ms.append(wall - wait)
        out.batch.append(batch if batch >= 0 else None)
        out.gpu_stall_ms.append(_maybe(stall))
        out.phase.append(phase)
    return out


def sample_columns(snapshot: RecordSnapshot) -> dict[str, dict[str, list[float | None]]]:
    """Sampler columns by source (``"host"``, ``"gpu:0"``...); ``t`` is seconds from the start,
    ``None`` where a value was unavailable."""
    tables: dict[str, dict[str, array]] = {}
    if snapshot.host is not None:
        tables["host"] = snapshot.host
    for index, columns in sorted(snapshot.gpus.items()):
        tables[f"gpu:{index}"] = columns
    return {
        name: {col: [_maybe(v) for v in values] for col, values in columns.items()}
        for name, columns in tables.items()
    }


def _plain(value: Any) -> Any:
    """``value`` as JSON-able Python data: objects with ``to_dict`` and dataclasses to dicts,
    NaN to None, numpy scalars to Python numbers."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):
        return _plain(to_dict())
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


@dataclass
class LabelledComparison:
    """A comparison with an earlier run; ``title`` names it, e.g. ``previous run #1 baseline``;
    ``prediction``: what a tuning of an earlier run of the cell predicted for this run's loader
    settings, shown beside the comparison with the previous run (None elsewhere)."""

    title: str
    comparison: Comparison
    prediction: Prediction | None = None


@dataclass
class JobRank:
    """This run's place in a ``torchrun`` job: rank ``rank`` of ``world_size`` (``RANK``,
    ``WORLD_SIZE``) in job ``job_id`` (``TORCHELASTIC_RUN_ID``; None: unset). ``gathered``:
    rank 0 received every rank's figures (its ``RunResult.ranks`` is the job's table and the
    report of every other rank is one line); ``why_not``: why they were not gathered (None when
    they were)."""

    rank: int
    world_size: int
    job_id: str | None = None
    gathered: bool = False
    why_not: str | None = None

    @property
    def reported_elsewhere(self) -> bool:
        """The job's report is rank 0's: this rank's result shows one line."""
        return self.gathered and self.rank != 0


def job_line(job: JobRank, summary: Summary, status: str, error: str | None) -> str:
    """``rank 1 of 2 in job 4f1c: 24 steps, 31.2 ms median step; the job's report is on rank
    0``: what a rank other than 0 of a gathered job shows instead of its report."""
    where = f" in job {job.job_id}" if job.job_id else ""
    parts = []
    if status != "completed":
        parts.append(f"{status} ({error})" if error else status)
    noun = "step" if summary.total_steps == 1 else "steps"
    parts.append(f"{summary.total_steps:,} {noun}")
    if summary.step_ms_median is not None:
        parts.append(f"{fmt_ms(summary.step_ms_median)} median step")
    return (
        f"rank {job.rank} of {job.world_size}{where}: {', '.join(parts)}; "
        "the job's report is on rank 0"
    )


@dataclass
class RunResult:
    """The outcome of one measured run.

    ``comparison`` is the comparison with the previous run of the same cell (``None`` for the
    first run or with ``--no-compare``), ``comparison_best`` the one with its best run when
    that is another run, ``baseline`` the one with its baseline; ``comparisons`` all of them,
    titled. ``samples`` maps a sampler source to its
    columns (see :func:`sample_columns`).
    """

    name: str
    status: EndStatus
    error: str | None
    elapsed_s: float
    run_id: int | None  #: number in the session history (``%traceml compare``)
    summary: Summary
    diagnosis: Diagnosis
    capabilities: Capabilities
    steps: StepArrays
    samples: dict[str, dict[str, list[float | None]]]
    device: str = "cpu"  #: "cpu", "cuda:N", or "cuda:N, not available"
    comparison: Comparison | None = None
    comparison_best: Comparison | None = None
    comparisons: list[LabelledComparison] = field(default_factory=list)
    #: the comparison with the run's baseline (several earlier runs, noise-aware), when it has
    #: one other than the previous run alone
    baseline: Comparison | None = None
    stored_id: int | None = None  #: the run's id in the store (``@17``); None: not stored
    store_note: str | None = None  #: why the run was not stored ('' / None: stored or off)
    environment: dict[str, Any] = field(default_factory=dict)  #: see session.environment
    cost: IdleCost | None = None  #: idle GPU time and its price (None: CPU run)
    #: what ``%traceml tune`` of an earlier run of the cell predicted for this run's loader
    #: settings, beside what this run measured (:class:`~traceml_nb.tune.prediction.
    #: Prediction`); None: no such tuning
    prediction: Prediction | None = None
    #: one line per experiment tracker the run was logged to (``--log-to``): what was logged
    #: where, or why nothing was
    trackers: list[str] = field(default_factory=list)
    #: the ``--profile`` capture's summary (:class:`~traceml_nb.analysis.profile_summary.ProfileSummary`:
    #: top operators, synchronising calls, the trace file); None: no profile was asked for
    profile: ProfileSummary | None = None
    #: the ranks the run launched (``torch.multiprocessing.spawn``, ``notebook_launcher``), side
    #: by side with the straggler (:class:`~traceml_nb.analysis.stragglers.RanksSummary`); None: the
    #: run launched none. The summary and the diagnosis are then those of ``ranks.reported``.
    ranks: RanksSummary | None = None
    #: the run's place in a ``torchrun`` job (:class:`JobRank`; None: not a rank of one). Rank
    #: 0 of a gathered job holds the job's ``ranks``, its summary and diagnosis its own.
    job: JobRank | None = None
    #: writes this result's report (``str(result)``); its session's, None: the one-line summary
    renderer: Renderer | None = field(default=None, repr=False, compare=False)

    @property
    def analysis(self) -> Analysis:
        return Analysis(self.summary, self.diagnosis, profile=self.profile)

    def job_line(self) -> str | None:
        """The one line this result shows instead of its report when the job's report is rank
        0's (:func:`job_line`); None otherwise."""
        if self.job is None or not self.job.reported_elsewhere:
            return None
        return job_line(self.job, self.summary, self.status, self.error)

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-able data (unavailable values are ``None``)."""
        return {
            "name": self.name,
            "status": self.status,
            "error": self.error,
            "elapsed_s": self.elapsed_s,
            "run_id": self.run_id,
            "summary": _plain(self.summary),
            "diagnosis": _plain(self.diagnosis),
            "comparison": _plain(self.comparison),
            "comparison_best": _plain(self.comparison_best),
            "baseline": _plain(self.baseline),
            "stored_id": self.stored_id,
            "store_note": self.store_note,
            "environment": _plain(self.environment),
            "cost": _plain(self.cost),
            "prediction": _plain(self.prediction),
            "trackers": list(self.trackers),
            "profile": _plain(self.profile),
            "ranks": _plain(self.ranks),
            "job": _plain(self.job),
            "capabilities": self.capabilities.to_dict(),
            "steps": _plain(self.steps.to_dict()),
            "samples": _plain(self.samples),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_dataframe(self, table: str = "steps") -> Any:
        """The steps (default) or one sampler source (``"host"``, ``"gpu:0"``) as a DataFrame."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "RunResult.to_dataframe() needs pandas, which is not installed: "
                "`pip install pandas`, or use .to_dict() / .steps instead"
            ) from None
        if table == "steps":
            return pd.DataFrame(self.steps.to_dict())
        if table not in self.samples:
            known = ", ".join(["steps", *self.samples]) or "steps"
            raise KeyError(f"no table {table!r} in this run; choose one of: {known}")
        return pd.DataFrame(self.samples[table])

    def diagnosis_words(self) -> DiagnosisText | None:
        """The diagnosis in words, as the report writes it (``.title``, ``.advice``, …; its
        :attr:`renderer`'s): :attr:`diagnosis` holds the same as codes and facts. None without
        a renderer."""
        return self.renderer.diagnosis_words(self.diagnosis) if self.renderer is not None else None

    def __str__(self) -> str:
        """The plain-text report (its :attr:`renderer`'s); the one-line summary without one."""
        if self.renderer is not None:
            try:
                return self.renderer.text(self)
            except Exception:  # the report's bug: the summary still prints
                pass
        return repr(self)

    def __repr__(self) -> str:
        line = self.job_line()
        if line is not None:
            return line
        step = self.summary.step_ms_median
        step_text = f", step {fmt_ms(step)} (median)" if step is not None else ""
        job_text = ""
        if self.job is not None and self.job.gathered and self.ranks is not None:
            straggler = self.ranks.straggler
            job_text = f"; job of {len(self.ranks.ranks)} ranks" + (
                f", straggler rank {straggler.rank}" if straggler else ", no straggler"
            )
        return (
            f"<traceml_nb.RunResult #{self.run_id} {self.name!r} {self.status}: "
            f"{self.diagnosis.verdict}, {self.summary.total_steps} steps{step_text}{job_text}>"
        )
