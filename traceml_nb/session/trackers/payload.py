"""What every tracker gets from a finished run, built once: the summary figures as metrics under
``traceml/`` (the unit in each name, as in :class:`~traceml_nb.analysis.findings.Summary`), the
verdict, confidence and advice as text, the static HTML report, and optionally the per-step
series, downsampled. A figure that could not be measured is left out, never logged as 0, and
the text says why."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...analysis.findings import Diagnosis
from ..result import OWN_PHASES, DiagnosisText

PREFIX = "traceml/"
#: The summary figures logged, in this order (``Summary`` field names: the unit is in the name;
#: ``_share`` is a fraction 0..1, ``_pct`` percent 0..100).
SUMMARY_METRICS = (
    "step_ms_median",
    "step_ms_p10",
    "step_ms_p90",
    "step_ms_mean",
    "data_wait_ms_median",
    "compute_ms_median",
    "copy_ms_median",
    "forward_ms_median",
    "backward_ms_median",
    "optimizer_ms_median",
    "other_ms_median",
    "data_wait_share",
    "gpu_stall_share",
    "samples_per_s",
    "steps_per_s",
    "gpu_util_median_pct",
    "sm_active_median_pct",
    "sm_occupancy_median_pct",
    "tensor_active_median_pct",
    "dram_bw_median_pct",
    "gpu_mem_peak_mb",
    "gpu_mem_total_mb",
    "process_cpu_median_pct",
    "workers_cpu_median_pct",
    "system_cpu_median_pct",
    "steal_mean_pct",
    "first_fetch_ms",
    "flops_per_step",
    "achieved_tflops",
    "mfu",
)
#: The tag that names the operators without a FLOP formula that ran in the model's step: where
#: it is set, ``flops_per_step``, ``achieved_tflops`` and ``mfu`` are lower bounds.
UNCOUNTED_TAG = "flops_uncounted_ops"
#: Counts and durations every run has.
COUNT_METRICS = ("total_steps", "steady_steps", "warmup_steps", "elapsed_s")
#: The per-step series (``--log-steps``): metric name -> ``StepArrays`` column.
STEP_SERIES = {
    "step_ms": "wall_ms",
    "data_wait_ms": "data_wait_ms",
    "compute_ms": "compute_ms",
    "gpu_stall_ms": "gpu_stall_ms",
}
STEPS_PREFIX = PREFIX + "steps/"
#: At most this many points of each per-step series (evenly spaced, the last step kept).
MAX_LOGGED_STEPS = 2000


@dataclass
class Payload:
    """What a tracker logs. ``metrics``: ``traceml/...`` -> value (only measured figures);
    ``skipped``: ``traceml/...`` -> why it is missing; ``tags``: ``traceml/verdict``,
    ``traceml/confidence``, ``traceml/advice``, ... -> text; ``text``: the text summary
    (Markdown); ``html``: the static report (None with ``html_note`` saying why); ``steps``:
    series name (``traceml/steps/step_ms``) -> ``[(step index, value)]`` (None without
    ``--log-steps``), ``steps_note`` what was downsampled or left out; ``status``: the run's."""

    name: str
    slug: str
    status: str
    step: int  #: the run's step count: the x at which the end-of-run figures are logged
    metrics: dict[str, float]
    skipped: dict[str, str]
    tags: dict[str, str]
    text: str
    html: str | None = None
    html_note: str | None = None
    steps: dict[str, list[tuple[int, float]]] | None = None
    steps_note: str = ""
    step_columns: list[str] = field(default_factory=list)

    @property
    def what(self) -> str:
        """``18 metrics, the verdict and the report``: what a tracker received."""
        parts = [f"{len(self.metrics)} metrics", "the verdict"]
        if self.html is not None:
            parts.append("the HTML report")
        if self.steps:
            n = max(len(points) for points in self.steps.values())
            parts.append(f"{n} steps of {len(self.steps)} series")
        return ", ".join(parts[:-1]) + " and " + parts[-1]

    def step_rows(self) -> tuple[list[str], list[list[Any]]]:
        """The per-step series as a table: the columns (``step`` first) and one row a step,
        None where a series has no value at that step."""
        if not self.steps:
            return [], []
        names = list(self.steps)
        by_step: dict[int, list[Any]] = {}
        for col, name in enumerate(names):
            for index, value in self.steps[name]:
                by_step.setdefault(index, [None] * len(names))[col] = value
        columns = ["step", *(n.removeprefix(STEPS_PREFIX) for n in names)]
        return columns, [[index, *by_step[index]] for index in sorted(by_step)]


def slug(name: str) -> str:
    """A file-name-safe form of a run name: ``cell [3]`` -> ``cell-3``."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return text[:80] or "run"


def downsample(n: int, k: int = MAX_LOGGED_STEPS) -> list[int]:
    """At most ``k`` indices of ``range(n)``, evenly spaced, the first and last kept."""
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _reason(summary: Any, name: str) -> str:
    why = summary.unavailable.get(name)
    if why is None and name.startswith("step_ms_"):
        why = summary.unavailable.get("step_ms_median")
    return why or "not measured in this run"


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


@dataclass
class _Codes:
    """A diagnosis where no renderer wrote its words: its findings' codes."""

    title: str
    cause: str | None
    advice: list[str]
    wont_help: list[str]
    saving: str | None


def _codes(d: Diagnosis) -> _Codes:
    return _Codes(
        title=d.title.code,
        cause=d.cause,
        advice=[f.code for f in d.advice],
        wont_help=[f.code for f in d.wont_help],
        saving=d.saving.code if d.saving is not None else None,
    )


def build_payload(
    result: Any,
    *,
    log_steps: bool = False,
    html: str | None = None,
    html_note: str | None = None,
    words: DiagnosisText | None = None,
) -> Payload:
    """The :class:`Payload` of a :class:`~traceml_nb.session.result.RunResult`; ``words``: its
    diagnosis in words (None: the findings' codes)."""
    s, d = result.summary, result.diagnosis
    w = words if words is not None else _codes(d)
    metrics: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for name in SUMMARY_METRICS:
        value = _number(getattr(s, name, None))
        if value is None:
            skipped[PREFIX + name] = _reason(s, name)
        else:
            metrics[PREFIX + name] = value
    for name in COUNT_METRICS:
        metrics[PREFIX + name] = float(getattr(s, name))
    _add_occasional_phases(s, metrics, skipped)
    saving = _number(d.saving_bound_share)
    if saving is not None:
        metrics[PREFIX + "saving_bound_share"] = saving
    tags = {
        PREFIX + "verdict": str(d.verdict),
        PREFIX + "confidence": str(d.confidence),
        PREFIX + "title": str(w.title),
        PREFIX + "status": str(result.status),
        PREFIX + "name": str(result.name),
    }
    if d.cause:
        tags[PREFIX + "cause_code"] = str(d.cause)
    if w.cause:
        tags[PREFIX + "cause"] = str(w.cause)
    if w.advice:
        tags[PREFIX + "advice"] = "\n".join(f"- {a}" for a in w.advice)
    if s.uncounted_ops and s.flops_per_step is not None:
        tags[PREFIX + UNCOUNTED_TAG] = ", ".join(s.uncounted_ops)
    payload = Payload(
        name=str(result.name),
        slug=slug(str(result.name)),
        status=str(result.status),
        step=int(s.total_steps),
        metrics=metrics,
        skipped=skipped,
        tags=tags,
        text="",
        html=html,
        html_note=html_note,
    )
    if log_steps:
        _add_steps(payload, result.steps)
    payload.text = summary_text(result, payload, w)
    return payload


def _add_occasional_phases(
    summary: Any, metrics: dict[str, float], skipped: dict[str, str]
) -> None:
    """A phase that ran in at most half of the steps (gradient accumulation's optimizer
    step) has a median of 0 over the steps: it is logged as its median where it ran
    (``{phase}_ms_median_where_ran``) and how often it ran (``{phase}_ran_share``, 0..1), as the
    report gives it, and its median over the steps is left out with why."""
    for phase, (ran, where_ms) in getattr(summary, "occasional_phases", {}).items():
        median = f"{PREFIX}{phase}_ms_median"
        metrics.pop(median, None)
        skipped[median] = (
            f"the {phase} ran in {ran:.0%} of the steps, so its median over the steps is 0: "
            f"{PREFIX}{phase}_ms_median_where_ran is its median over the steps it ran in"
        )
        metrics[f"{PREFIX}{phase}_ms_median_where_ran"] = float(where_ms)
        metrics[f"{PREFIX}{phase}_ran_share"] = float(ran)


def _add_steps(payload: Payload, steps: Any) -> None:
    own = [i for i, phase in enumerate(steps.phase) if phase in OWN_PHASES]
    keep = downsample(len(own))
    series: dict[str, list[tuple[int, float]]] = {}
    notes = []
    for name, column in STEP_SERIES.items():
        values = getattr(steps, column)
        points = [
            (j, v) for j in keep if (v := _number(values[own[j]])) is not None
        ]  # j: the step's number in the run, 0-based
        if points:
            series[STEPS_PREFIX + name] = points
        else:
            notes.append(f"{STEPS_PREFIX}{name}: no step has a value")
    if len(keep) < len(own):
        notes.insert(0, f"{len(own)} steps, {len(keep)} of them logged (evenly spaced)")
    payload.steps = series
    payload.steps_note = "; ".join(notes)


def summary_text(result: Any, payload: Payload, words: DiagnosisText) -> str:
    """The text summary (Markdown: it reads as plain text too), the diagnosis in ``words``."""
    from ...analysis.formatting import fmt_ms, fmt_s

    s, d = result.summary, result.diagnosis
    step = f", step {fmt_ms(s.step_ms_median)} (median)" if s.step_ms_median is not None else ""
    lines = [
        f"**traceml_nb: {result.name!r} {result.status}**, {s.total_steps} steps in "
        f"{fmt_s(float(s.elapsed_s))}{step}",
        "",
        f"**Verdict: {d.verdict}** ({d.confidence} confidence): {words.title}",
    ]
    if words.cause:
        lines += ["", f"Cause: {words.cause}"]
    if result.error:
        lines += ["", f"The run ended with: {result.error}"]
    if words.advice:
        lines += ["", "Advice:", *(f"- {a}" for a in words.advice)]
    if words.wont_help:
        lines += ["", "Won't help:", *(f"- {a}" for a in words.wont_help)]
    if words.saving:
        lines += ["", f"Saving: {words.saving}"]
    uncounted = payload.tags.get(PREFIX + UNCOUNTED_TAG)
    if uncounted:
        lines += [
            "",
            "Lower bounds: traceml/flops_per_step, traceml/achieved_tflops and traceml/mfu leave "
            f"out whatever FLOPs these operators did, which the counter has no formula for: "
            f"{uncounted}",
        ]
    if payload.skipped:
        lines += ["", "Not logged (unavailable in this run, never logged as 0):"]
        lines += [f"- {name}: {why}" for name, why in payload.skipped.items()]
    if payload.steps_note:
        lines += ["", f"Per-step series: {payload.steps_note}"]
    if payload.html_note:
        lines += ["", f"No HTML report: {payload.html_note}"]
    return "\n".join(lines)
