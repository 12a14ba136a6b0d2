"""The report's metric lines and sentences, and the plain-text report.

Everything here is pure: values in, strings out. A value that was not measured is shown as
``unavailable (why)``, never as 0. The HTML report (:mod:`.html`) uses the same metric lines
and sentences, so the two versions always say the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.comparison import Comparison
from ..analysis.findings import PhaseSummary, Summary
from ..analysis.formatting import fmt_mb, fmt_ms, fmt_pct, fmt_rate, fmt_s, fmt_share
from ..analysis.profile_summary import ProfileSummary
from ..analysis.step_anatomy import MEDIAN_FIELDS
from ..engine.capabilities import Capabilities
from ..tune.prediction import Prediction
from . import profile_section as profile_view
from .comparison_words import headline
from .comparison_words import rows as comparison_rows
from .diagnosis_words import diagnosis_words
from .rank_table import ranks_text
from .report_content import ReportContent, RunMeta


def _finite(value: float | None) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def format_value(value: Any) -> str:
    """A comparison cell: strings as given, numbers with 3 significant digits."""
    if value is None:
        return "unavailable"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "unavailable"
        return f"{value:.3g}"
    return str(value)


def unavailable(reason: str) -> str:
    return f"unavailable ({reason})"


# --- the metric lines ------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricLine:
    """One line of the metrics table: ``text`` is the value or ``unavailable (why)``."""

    label: str
    text: str
    available: bool


@dataclass(frozen=True)
class _Metric:
    label: str
    field: str
    capability: str  #: where the reason comes from when the summary gives none
    render: Callable[[Summary, Any], str]


def _ms_with_spread(s: Summary, v: float) -> str:
    text = fmt_ms(v)
    if _finite(s.step_ms_p10) and _finite(s.step_ms_p90):
        assert s.step_ms_p10 is not None and s.step_ms_p90 is not None
        text += f" (p10 {fmt_ms(s.step_ms_p10)}, p90 {fmt_ms(s.step_ms_p90)})"
    if s.step_block > 1:  # (the loader's workers' rounds: analysis.step_blocks)
        text += f", over blocks of {s.step_block} steps"
    return text


def _memory(s: Summary, v: float) -> str:
    if _finite(s.gpu_mem_total_mb) and s.gpu_mem_total_mb:
        return f"{fmt_mb(v)} of {fmt_mb(s.gpu_mem_total_mb)}"
    return fmt_mb(v)


#: The GPM figures shown beside SM activity, by their Summary fields.
GPM_BESIDE = (
    ("SM occupancy", "sm_occupancy_median_pct"),
    ("tensor cores", "tensor_active_median_pct"),
    ("DRAM bandwidth", "dram_bw_median_pct"),
)


def _sm_activity(s: Summary, v: float) -> str:
    """``62% (SM occupancy 40%, tensor cores 12%, DRAM bandwidth 30%)``: the GPM medians, each
    where it was measured."""
    beside = [(label, getattr(s, field)) for label, field in GPM_BESIDE]
    measured = ", ".join(f"{label} {fmt_pct(x)}" for label, x in beside if _finite(x))
    return f"{fmt_pct(v)} ({measured})" if measured else fmt_pct(v)


def _step_phases(s: Summary, v: float) -> str:
    """``copy 1.06 ms (7%), forward 4.14 ms (28%), …``: each timed part's median and its
    share of the steps' time (``GPU time: …`` where they were timed on the GPU); a phase that
    ran in at most half of the steps, its median where it ran and how often:
    ``optimizer 0.8 ms in 25% of the steps (12%)``; the phases not timed while the others
    were, unavailable with why: ``; copy and forward unavailable (…)``."""
    parts = []
    for part, field in MEDIAN_FIELDS.items():
        value = getattr(s, field)
        if _finite(value):
            share = s.phase_shares.get(part)
            beside = f" ({fmt_share(share)})" if _finite(share) else ""
            occasional = s.occasional_phases.get(part)
            if occasional:
                ran, when = occasional
                value_text = f"{fmt_ms(when)} in {fmt_share(ran)} of the steps"
            else:
                value_text = fmt_ms(value)
            parts.append(f"{part} {value_text}{beside}")
    text = ("GPU time: " if s.phases_on_gpu else "") + ", ".join(parts)
    untimed: dict[str, list[str]] = {}  # the phases not timed, by why
    for part, field in MEDIAN_FIELDS.items():
        why = s.unavailable.get(field) if getattr(s, field) is None else None
        if why:
            untimed.setdefault(why, []).append(part)
    for why, names in untimed.items():
        text += f"; {' and '.join(names)} unavailable ({why})"
    return text


def _flops(s: Summary, v: float) -> str:
    """``3.2 GFLOP (counted on one step)``; ``(counted over 4 steps, their mean)`` where the
    count spanned an optimizer step's cycle of several; the batches' sizes it was taken in
    proportion to; and the work the figure leaves out: the forwards recomputed by activation
    checkpointing, an optimizer's own."""
    n = s.flop_window_steps
    how = f"counted over {n:,} steps, their mean" if n > 1 else "counted on one step"
    if s.flop_input_elements:
        counted, _, least, most = s.flop_input_elements
        of = f"a batch of {counted:,.0f}" if n <= 1 else f"batches of {counted:,.0f} on average"
        how = (
            f"the steps' mean: {how}, of {of} elements, and taken in proportion to each "
            f"step's; the batches differ in size, {least:,.0f} to {most:,.0f} elements in their "
            "first tensor"
        )
    if s.flops_since_step is not None:
        how += (
            "; counted again as the parameters it trains changed: the steps from step "
            f"{s.flops_since_step:,} on"
        )
    if s.recomputed_flops_per_step:
        how += (
            f"; {_flop_amount(s.recomputed_flops_per_step)} more recomputed by activation "
            "checkpointing, not counted as the model's"
        )
    if s.outside_flops_per_step or s.uncounted_outside_ops:
        how += f"; {_outside(s)} not counted as the model's"
    if s.uncounted_ops:
        how += (
            "; without whatever FLOPs these operators did, which the counter has no formula "
            f"for: {', '.join(s.uncounted_ops)}"
        )
    ran_in = f" in {_precision_mix(s)}" if set(s.flop_precisions) - {"fp32"} else ""
    return f"{_at_least(s)}{_flop_amount(v)}{ran_in} ({how})"


def _precision_mix(s: Summary) -> str:
    """``bf16``, or ``fp16 98%, fp32 2%``: the precisions the FLOPs were counted in."""
    ranked = sorted(s.flop_precisions.items(), key=lambda kv: -kv[1])
    if len(ranked) == 1:
        return ranked[0][0]
    return ", ".join(f"{k} {fmt_share(share)}" for k, share in ranked)


def _outside(s: Summary) -> str:
    """``1.2 GFLOP more outside the model (an optimizer's own work, the batch's preparation),``;
    where operators without a formula ran there, ``at least …`` and which, or the work without
    a figure where they alone ran."""
    ops = ", ".join(s.uncounted_outside_ops)
    where = "outside the model (an optimizer's own work, the batch's preparation"
    if not ops:
        return f"{_flop_amount(s.outside_flops_per_step)} more {where}),"
    no_formula = f"operators the counter has no formula for: {ops}"
    if not s.outside_flops_per_step:
        return f"more work {where}, by {no_formula}),"
    amount = _flop_amount(s.outside_flops_per_step)
    return f"at least {amount} more {where}; without whatever FLOPs there of {no_formula}),"


def _flop_amount(v: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} FLOP"


def _at_least(s: Summary) -> str:
    """Where operators without a formula ran, the FLOPs are a lower bound, and so is what they
    make of the device."""
    return "at least " if s.uncounted_ops else ""


def _tflops(s: Summary, v: float) -> str:
    return _at_least(s) + (f"{v:.3g} TFLOP/s" if v >= 0.1 else f"{v * 1e3:.3g} GFLOP/s")


def _mfu(s: Summary, v: float) -> str:
    """``23% (of a 65 TFLOP/s peak: fp16 98%, fp32 2%)``."""
    if not _finite(s.mfu_peak_tflops):
        return _at_least(s) + fmt_share(v)
    mix = _precision_mix(s)
    return f"{_at_least(s)}{fmt_share(v)} (of a {s.mfu_peak_tflops:.3g} TFLOP/s peak: {mix})"


METRICS: tuple[_Metric, ...] = (
    _Metric("step time (median)", "step_ms_median", "steps", _ms_with_spread),
    _Metric("data wait (median)", "data_wait_ms_median", "data_wait", lambda s, v: fmt_ms(v)),
    _Metric("rest of the step (median)", "compute_ms_median", "steps", lambda s, v: fmt_ms(v)),
    _Metric("step phases (median, share)", "other_ms_median", "steps", _step_phases),
    _Metric("data wait share", "data_wait_share", "data_wait", lambda s, v: fmt_share(v)),
    _Metric("FLOPs per step", "flops_per_step", "steps", _flops),
    _Metric("achieved FLOP/s", "achieved_tflops", "steps", _tflops),
    _Metric("MFU", "mfu", "steps", _mfu),
    _Metric("GPU input stall share", "gpu_stall_share", "gpu_events", lambda s, v: fmt_share(v)),
    _Metric(
        "GPU utilisation (median)",
        "gpu_util_median_pct",
        "gpu_utilisation",
        lambda s, v: fmt_pct(v),
    ),
    _Metric("SM activity (median)", "sm_active_median_pct", "gpm_sm_active", _sm_activity),
    _Metric("GPU memory peak", "gpu_mem_peak_mb", "gpu_memory", _memory),
    _Metric("throughput", "samples_per_s", "steps", lambda s, v: fmt_rate(v, "samples/s")),
    _Metric("steps per second", "steps_per_s", "steps", lambda s, v: fmt_rate(v, "steps/s")),
    _Metric("batch size", "batch_size", "steps", lambda s, v: f"{v:,}"),
    _Metric("first batch (worker start-up)", "first_fetch_ms", "data_wait", lambda s, v: fmt_ms(v)),
    _Metric(
        "main process CPU",
        "process_cpu_median_pct",
        "host",
        lambda s, v: f"{fmt_pct(v)} (100% = one core)",
    ),
    _Metric(
        "DataLoader workers CPU",
        "workers_cpu_median_pct",
        "host",
        lambda s, v: f"{fmt_pct(v)} (all workers, 100% = one core)",
    ),
    _Metric("system CPU", "system_cpu_median_pct", "host", lambda s, v: fmt_pct(v)),
    _Metric("CPUs available", "cpus_available", "host", lambda s, v: f"{v}"),
)


def unavailable_reason(
    summary: Summary, field: str, capability: str, capabilities: Capabilities
) -> str:
    """Why ``field`` has no value: the analysis' reason, else the capability's, else generic."""
    reason = summary.unavailable.get(field)
    if reason:
        return reason
    if not capabilities.ok(capability) and capability in capabilities.reasons:
        return capabilities.why(capability)
    return "not measured in this run"


def metric_lines(summary: Summary, capabilities: Capabilities) -> list[MetricLine]:
    """The metrics table of the report, in order; every metric appears, measured or not."""
    lines = []
    for metric in METRICS:
        value = getattr(summary, metric.field)
        if _finite(value):
            lines.append(MetricLine(metric.label, metric.render(summary, value), True))
        else:
            reason = unavailable_reason(summary, metric.field, metric.capability, capabilities)
            lines.append(MetricLine(metric.label, unavailable(reason), False))
    return lines


# --- the report's sentences, shared by the text and HTML versions ----------------------------
def steps_phrase(summary: Summary) -> str:
    """``200 steps (5 warm-up, 195 measured)``, with the steps an evaluation ran inside when
    there are any, or why there are none."""
    if summary.total_steps == 0:
        return "no training steps seen"
    noun = "step" if summary.total_steps == 1 else "steps"
    parts = [f"{summary.warmup_steps:,} warm-up"]
    if summary.interleaved_steps:
        parts.append(f"{summary.interleaved_steps:,} with an evaluation inside")
    if summary.profiled_steps:
        parts.append(f"{summary.profiled_steps:,} profiled")
    if summary.flop_counted_steps:
        parts.append(f"{summary.flop_counted_steps:,} FLOP-counted")
    parts.append(f"{summary.steady_steps:,} measured")
    return f"{summary.total_steps:,} {noun} ({', '.join(parts)})"


def one_line(error: str) -> str:
    """An error as one line: a multi-line one (torch's ``ProcessRaisedException`` carries the
    failed rank's traceback) as its first line and its last, the exception that was raised."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else error
    return f"{lines[0]} \u2026 {lines[-1]}"


def status_sentence(status: str, error: str | None, summary: Summary) -> str | None:
    """The partial-report warning for a failed or interrupted run (None when it completed)."""
    error = one_line(error) if error else error
    if summary.total_steps:
        covered = f"the numbers cover the {summary.total_steps:,} steps measured before it stopped"
    else:
        covered = "no step was measured before it stopped"
    if status == "failed":
        return f"Partial report: the cell failed ({error or 'an exception'}); {covered}."
    if status == "interrupted":
        return f"Partial report: the cell was interrupted; {covered}."
    if status not in ("completed", "running"):
        return f"Partial report: the run ended as {status!r}."
    return None


def phase_text(phase: PhaseSummary) -> str:
    """``40 batches, 0.66 s; 2 of them, 0.05 s, before training`` (a sanity check apart)."""
    text = f"{phase.batches:,} batches, {fmt_s(phase.total_s)}"
    if phase.before_training_batches and phase.before_training_batches < phase.batches:
        text += (
            f"; {phase.before_training_batches:,} of them, {fmt_s(phase.before_training_s)}, "
            "before training"
        )
    return text


# --- the plain-text report -------------------------------------------------------------------
def run_label(meta: RunMeta) -> str:
    """``#3 "baseline"``, or ``"baseline"`` before the run has a number."""
    name = f'"{meta.name}"'
    return f"#{meta.run_id} {name}" if meta.run_id is not None else name


def _bullets(title: str, items: Sequence[str]) -> list[str]:
    if not items:
        return []
    return [f"{title}:"] + [f"  - {item}" for item in items]


def _metrics_text(metrics: Sequence[MetricLine]) -> list[str]:
    """Measured metrics one a line; unavailable ones grouped by their reason, to stay compact."""
    measured = [m for m in metrics if m.available]
    lines = ["Metrics:"]
    if measured:
        width = max(len(m.label) for m in measured)
        lines += [f"  {m.label.ljust(width)}  {m.text}" for m in measured]
    by_reason: dict[str, list[str]] = {}
    for m in metrics:
        if not m.available:
            by_reason.setdefault(m.text, []).append(m.label)
    lines += [f"  {', '.join(labels)}: {text}" for text, labels in by_reason.items()]
    return lines


def render_text(report: ReportContent) -> str:
    """The whole report as plain text (the ``text/plain`` version, and what a terminal shows)."""
    if report.job_line:
        return report.job_line
    meta, summary, diagnosis = report.meta, report.analysis.summary, report.analysis.diagnosis
    lines = [
        f"traceml report: {run_label(meta)} {meta.status} in {fmt_s(meta.elapsed_s)}, "
        f"{steps_phrase(summary)}"
    ]
    warning = status_sentence(meta.status, meta.error, summary)
    if warning:
        lines.append(warning)
    words = diagnosis_words(diagnosis)
    lines.append(f"Verdict: {words.verdict} ({words.confidence} confidence): {words.title}")
    if words.cause:
        lines.append(f"  cause: {words.cause}")
    if words.profiled_cause:
        lines.append(f"  profile: {words.profiled_cause}")
    lines += _bullets("Evidence", words.evidence)
    lines += _bullets("Advice", words.advice)
    lines += _bullets("Will not help", words.wont_help)
    if words.saving:
        lines.append(f"Saving bound: {words.saving}")
    lines += _bullets("Also", words.also)
    if report.cost_text:
        lines.append(report.cost_text)
    if report.ranks is not None:
        lines += ranks_text(report.ranks)
    for item in report.comparisons:
        lines += comparison_head(f"vs {item.title}", item.comparison, item.prediction)
    lines += _metrics_text(metric_lines(summary, report.capabilities))
    lines += [f"  {p.name}: {p.batches:,} batches, {fmt_s(p.total_s)}" for p in summary.phases]
    if report.profile is not None:
        lines += profile_text(report.profile)
    lines += _bullets("Notes", report.notes)
    return "\n".join(lines)


def profile_text(profile: ProfileSummary) -> list[str]:
    """The profile section: the top operators by host and by GPU time, then its facts."""
    lines = [profile_view.heading(profile)]
    for title, rows in profile_view.op_tables(profile):
        lines.append(f"  top operators {title} (share, a step, calls a step):")
        width = max(len(r.name) for r in rows)
        lines += [
            f"    {r.name:<{width}}  {r.share:>4}  {r.per_step:>9}  {r.calls:>6}"
            + (f"  {r.where}" if r.where else "")
            for r in rows
        ]
    lines += [f"  {fact}" for fact in profile_view.facts(profile)]
    return lines


# --- %traceml history and %traceml compare -----------------------------------------------------
def comparison_lines(comparison: Comparison, prediction: Prediction | None = None) -> list[str]:
    """A comparison's rows (and a tuning's ``prediction``'s) as ``label: before → after (delta)``
    lines."""
    out = []
    for label, before, after, delta, _direction in comparison_rows(comparison, prediction):
        change = f"{format_value(before)} \u2192 {format_value(after)} ({format_value(delta)})"
        out.append(f"  {label}: {change}")
    return out


def comparison_head(
    title: str, comparison: Comparison, prediction: Prediction | None = None
) -> list[str]:
    """The note (e.g. across hardware classes), ``title: headline``, and what changed."""
    out = [comparison.note] if getattr(comparison, "note", "") else []
    out.append(f"{title}: {headline(comparison, prediction)}")
    changes = list(getattr(comparison, "changes", []) or [])
    if changes:
        out.append(f"  what changed: {changes[0]}")
        out += [f"    {line}" for line in changes[1:]]
    return out


def render_comparison_text(title: str, comparison: Comparison) -> str:
    return "\n".join([*comparison_head(title, comparison), *comparison_lines(comparison)])
