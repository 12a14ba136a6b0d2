"""The words of a comparison: its headline, the noise it was judged against, a tuning's
prediction beside it.

:func:`traceml_nb.analysis.comparison.compare` returns what it found as numbers (the step
times, their ratio, the judgement and the noise it was judged against); these functions write
them: ``step time 31.8 ms → 12.4 ms (−61%, faster, beyond the run-to-run noise (±7.4%: 5 runs
of this configuration))``.
"""

from __future__ import annotations

from typing import Any

from ..analysis.comparison import NEUTRAL, Comparison, ComparisonRow
from ..analysis.formatting import MINUS, fmt_ms, plural, signed_pct
from ..analysis.judge import FASTER, INCONCLUSIVE, NO_CHANGE, SLOWER, Judgement
from ..analysis.noise import Noise
from ..analysis.phase_shift import PhaseShift
from ..analysis.thresholds import BUSY_NOISE_FACTOR
from ..tune.prediction import Prediction


def fmt_pct_plain(share: float) -> str:
    """A fraction as a percentage with one decimal below 10%: 0.031 → '3.1%', 0.12 → '12%'."""
    pct = share * 100
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def noise_source(noise: Noise, after_busy: bool = False) -> str:
    """Where the noise comes from: ``5 runs of this configuration``, ``7 runs of 2
    configurations and 3 other configurations on this machine``, or ``assumed for 10 ms steps
    until reruns tell``; ``… (1 more on this machine left out: …)`` where the noise left a
    configuration out (:data:`~traceml_nb.analysis.thresholds.CLASS_OUTLIER_LEVEL`), ``…
    (2 other configurations on this machine set aside: …)`` where it set the other
    configurations aside (:data:`~traceml_nb.analysis.thresholds.OWN_NOISIER_LEVEL`); for runs
    of different sessions ``…, between sessions``; with ``after_busy``, ``…, 5× for this run
    on a busy machine``."""
    busy = f", {BUSY_NOISE_FACTOR:g}\u00d7 for this run on a busy machine" if after_busy else ""
    sessions = " between sessions" if noise.across_sessions else ""
    parts = []
    if noise.own_configs == 1:
        parts.append(f"{noise.own_runs} runs of this configuration")
    elif noise.own_configs > 1:
        parts.append(f"{noise.own_runs} runs of {noise.own_configs} configurations")
    if noise.class_configs:
        parts.append(f"{plural(noise.class_configs, 'other configuration')} on this machine")
    notes = []
    if noise.class_left_out:
        n = noise.class_left_out
        who = f"{n} more" if noise.class_configs else plural(n, "other configuration")
        notes.append(
            f"{who} on this machine left out: {'its' if n == 1 else 'their'} runs scattered far "
            "beyond the rest"
        )
    if noise.class_set_aside:
        n = noise.class_set_aside
        who = f"{n} more" if notes else f"{plural(n, 'other configuration')} on this machine"
        mine = "this configuration's" if noise.own_configs == 1 else "these configurations'"
        notes.append(
            f"{who} set aside: {'its' if n == 1 else 'their'} runs scatter less than {mine}"
        )
    left_out = f" ({'; '.join(notes)})" if notes else ""
    if not parts:
        return (
            f"assumed for {fmt_ms(noise.step_ms)} steps{sessions} until reruns tell{left_out}{busy}"
        )
    return " and ".join(parts) + left_out + ("," + sessions if sessions else "") + busy


def band_text(judgement: Judgement) -> str:
    """The least change the compared runs can tell at the verdict's confidence, each way:
    ``±7.4%``, or ``−40%/+68%`` where the two sides differ by a percentage point or more (the
    bounds are symmetric in log step time, so a wide band is not: −40% is as far down as +68%
    is up)."""
    up = judgement.half_width
    down = 1.0 / (1.0 + up) - 1.0
    if (up + down) * 100 < 1:
        return f"\u00b1{fmt_pct_plain(up)}"
    return f"{MINUS}{fmt_pct_plain(-down)}/+{fmt_pct_plain(up)}"


def verdict_tail(
    judgement: Judgement,
    noise: Noise | None,
    after_busy: bool = False,
    runs: tuple[int, int] = (1, 1),
) -> str:
    """The words after the change in a headline: ``slower, beyond the run-to-run noise
    (±7.4%: 5 runs of this configuration)``, ``no significant change: within …``; an
    inconclusive verdict says what the runs compared (``runs``: the baseline's and the
    candidate's count) can tell and the noise apart, since with few runs the first is many
    times the second: ``inconclusive: 1 run against 1 can tell only a change beyond −40%/+68% at a
    run-to-run noise of 8.0% (assumed for 18.7 ms steps until reruns tell); 1 more run would
    decide``."""
    band = band_text(judgement)
    source = f": {noise_source(noise, after_busy)}" if noise is not None else ""
    verdict = judgement.verdict
    if verdict in (FASTER, SLOWER):
        return f"{verdict}, beyond the run-to-run noise ({band}{source})"
    if verdict == NO_CHANGE:
        return f"{NO_CHANGE}: within the run-to-run noise ({band}{source})"
    more = judgement.more_needed
    if more is None:
        decide = "a change this small cannot be told at this noise"
    else:
        decide = f"{plural(more, 'more run')} would decide"
    before, after = runs
    tells = f"{plural(before, 'run')} against {after}"
    tells += f" can tell only a change beyond {band}"
    if noise is not None:
        tells += (
            f" at a run-to-run noise of {fmt_pct_plain(noise.sigma)} "
            f"({noise_source(noise, after_busy)})"
        )
    return f"{INCONCLUSIVE}: {tells}; {decide}"


#: the headline's tail where the noise model saw a change but the runs' own steps overlap
STEPS_OVERLAP = (
    f"{INCONCLUSIVE}: the runs' own steps overlap (the step-level bootstrap interval includes no "
    "change)"
)


def headline(comparison: Comparison, prediction: Prediction | None = None) -> str:
    """``step time 31.8 ms → 12.4 ms (−61%, faster, beyond the run-to-run noise (…))``, or why
    the step time is not comparable; then what a tuning predicted (``prediction``), where one
    did."""
    c = comparison
    if c.judgement is None or c.step_ratio is None:
        missing = [f"#{i}" for i in c.no_steady_ids]
        verb = "has" if len(missing) == 1 else "have"
        text = f"step time not comparable: {' and '.join(missing)} {verb} no steady steps"
    else:
        tail = (
            STEPS_OVERLAP
            if c.steps_overlap
            else verdict_tail(c.judgement, c.noise, c.after_busy, runs=runs_compared(c))
        )
        text = f"{judged_move(c)} ({signed_pct(c.step_ratio - 1)}, {tail})"
        if c.batch_sizes is not None:
            text += f"; {per_sample_reason(c)}"
    if c.significant and c.phase_shift is not None and c.phase_shift.moved:
        text += f"; {where_it_moved(c.phase_shift)}"
    if prediction is not None:
        text += f"; {prediction_sentence(prediction)}"
    return text


def judged_move(comparison: Comparison) -> str:
    """What the verdict judged, from the baseline to the candidate: ``step time 31.8 ms →
    12.4 ms``, or ``time per sample 0.031 ms → 0.0281 ms`` where the batch size changed."""
    before, after = comparison.judged_ms()
    what = "step time" if comparison.batch_sizes is None else "time per sample"
    return f"{what} {fmt_ms(before)} \u2192 {fmt_ms(after)}"


def per_sample_reason(comparison: Comparison) -> str:
    """Why a comparison judged the time per sample (:func:`batch_change_words`)."""
    c = comparison
    return batch_change_words(c.batch_sizes or (1.0, 1.0), c.before_ms, c.after_ms)


def batch_change_words(
    sizes: tuple[float, float], before_ms: float | None, after_ms: float | None
) -> str:
    """``the batch size went 32 → 64, so the steps are compared per sample (step time 0.988 ms →
    1.8 ms, +82%)``: the batch sizes and the step times (ms) of the two sides."""
    steps = f"step time {fmt_ms(before_ms)} \u2192 {fmt_ms(after_ms)}"
    if before_ms and after_ms:
        steps += f", {signed_pct(after_ms / before_ms - 1)}"
    return (
        f"the batch size went {fmt_size(sizes[0])} \u2192 {fmt_size(sizes[1])}, so the steps "
        f"are compared per sample ({steps})"
    )


def as_sentence(words: str) -> str:
    """``words`` as a sentence of a gate's paragraph: a capital, a full stop."""
    return f"{words[:1].upper()}{words[1:]}."


def fmt_size(size: float) -> str:
    """A batch size: ``64``, or ``48.5`` for the mean of runs of different sizes."""
    return str(round(size)) if abs(size - round(size)) < 1e-6 else f"{size:.1f}"


def runs_compared(comparison: Comparison) -> tuple[int, int]:
    """How many runs each side of ``comparison`` is made of (at least one each)."""
    return max(1, len(comparison.baseline_ids)), max(1, len(comparison.candidate_ids))


def where_it_moved(shift: PhaseShift) -> str:
    """``backward 40 ms → 70 ms (+75%), the other parts steady``: the parts of the step that
    moved (:mod:`~traceml_nb.analysis.phase_shift`) and, where others were timed too, that
    they did not; ``per sample: …`` where the times are a sample's."""
    moved = "per sample: " if shift.per_sample else ""
    moved += ", ".join(
        f"{name} {fmt_ms(a)} \u2192 {fmt_ms(b)} ({signed_pct(b / a - 1) if a else 'new'})"
        for name, a, b in shift.moved
    )
    if shift.steady:
        moved += ", the other parts steady"
    return moved


def rows(comparison: Comparison, prediction: Prediction | None = None) -> list[ComparisonRow]:
    """The comparison's table, with the rows of a tuning's ``prediction`` after its own."""
    extra = prediction_rows(prediction) if prediction is not None else []
    return [*comparison.rows, *extra]


def comparison_text(comparison: Comparison) -> str:
    """A plain-text table of the comparison: ``#5 vs #4: <headline>`` and a row per figure."""
    c = comparison
    lines = [f"#{c.candidate_id} vs #{c.baseline_id}: {headline(c)}"]
    if c.note:
        lines.insert(0, c.note)
    table = rows(c)
    width = max((len(r.label) for r in table), default=0)
    for r in table:
        lines.append(f"  {r.label:<{width}}  {r.before:>14}  \u2192  {r.after:<14}  {r.delta}")
    return "\n".join(lines)


def to_dict(comparison: Comparison) -> dict[str, Any]:
    """The comparison's data (:meth:`~traceml_nb.analysis.comparison.Comparison.to_dict`) with
    its headline and its rows as shown."""
    data = comparison.to_dict()
    data["headline"] = headline(comparison)
    data["rows"] = [row._asdict() for row in rows(comparison)]
    return data


# --- a tuning's prediction ------------------------------------------------------------------------
def prediction_rows(prediction: Prediction) -> list[ComparisonRow]:
    """The rows that put a tuning's prediction beside the measured
    step time, and where the model's own compute changed by more than ``COMPUTE_CHANGE_SHARE``,
    the prediction made again for the rerun's compute."""
    measured = prediction.measured_ms
    out = [
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
        out.append(
            ComparisonRow(
                f"step time predicted for this run's compute ({fmt_ms(prediction.compute_ms)})",
                fmt_ms(again),
                fmt_ms(measured),
                signed_pct(measured / again - 1),
                NEUTRAL,
            )
        )
    return out


def prediction_sentence(prediction: Prediction) -> str:
    """``%traceml tune of #1 predicted 27.2 ms a step for these settings: measured 28.0 ms
    (+3%)``, and where the model's own compute changed by more than ``COMPUTE_CHANGE_SHARE``,
    by how much (the prediction is for the tuned run's compute) and the prediction made again
    for this run's compute (``: for 26.7 ms it is 29.2 ms (measured −3%)``)."""
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
