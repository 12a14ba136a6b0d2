"""The words of ``check``'s verdict: one paragraph from the :class:`~traceml_nb.session.check.
CheckResult` (the runs judged, their baseline, the comparison and the gate's bounds).

``REGRESSION: 'train' @12 is slower than its baseline, 5 runs @6–@10: step time 11.4 ms →
13.5 ms (+18%; at least +6.2% with 99.5% confidence), beyond the run-to-run noise (5 runs of
this configuration); the gate is set to catch a slowdown of 10%.``
"""

from __future__ import annotations

from ..analysis.formatting import (
    fmt_confidence,
    fmt_run_span,
    signed_pct,
    signed_pct_fine,
)
from ..analysis.judge import INCONCLUSIVE as INCONCLUSIVE_VERDICT
from ..analysis.judge import SLOWER
from ..analysis.thresholds import FALSE_ALARM_RATE, MISS_RATE
from ..session.baselines import EARLIER
from ..session.check import CheckResult, subject
from ..session.conclusion import values_words
from ..session.history import RunEntry
from ..session.stored_jobs import StoredJob
from .comparison_words import (
    as_sentence,
    fmt_pct_plain,
    headline,
    judged_move,
    noise_source,
    per_sample_reason,
)


def check_paragraph(result: CheckResult) -> str:
    """The gate's outcome in one paragraph: why there is no verdict, or the judged runs'
    step time against their baseline's with the gate's bounds, and what changed."""
    r, comparison = result, result.comparison
    if comparison is None or r.candidate is None:
        return r.why
    who = subject(r.name, r.candidate, r.job, r.candidates, r.left_out)
    ratio, judgement = comparison.step_ratio, comparison.judgement
    if ratio is None or judgement is None:
        if r.job is None:
            return f"{r.name!r}: no verdict on @{r.candidate.stored_id}: {headline(comparison)}."
        return f"no verdict on {who}: {headline(comparison)}."
    of = baseline_words(r.baseline, r.baseline_jobs or [None] * len(r.baseline))
    if r.baseline_kind == EARLIER:
        of += " of the configuration before it"
    of += values_words(r.baseline_values, r.baseline_split_by)
    move = judged_move(comparison)
    change = signed_pct(ratio - 1)
    low = judgement.bound(FALSE_ALARM_RATE)
    high = judgement.bound(1 - MISS_RATE)
    at_least = (
        f"at least {signed_pct_fine(low)} with {fmt_confidence(1 - FALSE_ALARM_RATE)} confidence"
    )
    at_most = f"at most {signed_pct_fine(high)} with {fmt_confidence(1 - MISS_RATE)} confidence"
    noise = comparison.noise
    band = "the run-to-run noise"
    if noise is not None:
        band += f" ({noise_source(noise, comparison.after_busy)})"
    allowed = f"a slowdown of {fmt_pct_plain(r.max_slowdown)}"
    what = list(comparison.changes[1:])
    changed = ""
    if what:
        changed = f" What changed: {'; '.join(what)}."
    elif comparison.changes:
        first = comparison.changes[0]
        changed = f" {first[:1].upper()}{first[1:]}"
    if comparison.verdict == SLOWER:
        head = (
            f"REGRESSION: {who} is slower than its baseline, {of}: {move} "
            f"({change}; {at_least}), beyond {band}; the gate is set to catch {allowed}."
        )
    elif comparison.verdict == INCONCLUSIVE_VERDICT:
        more = judgement.more_needed
        decide = (
            f"{more} more run{'s' if more != 1 else ''} of it would decide"
            if more is not None
            else "a change this small cannot be told at this noise; an A/B run "
            "(python -m traceml_nb ab) pairs the runs so the machine's drift cancels"
        )
        head = (
            f"INCONCLUSIVE: {who} against its baseline, {of}: {move} ({change}; "
            f"{at_least}, {at_most}): neither {allowed} nor no slowdown can be ruled out "
            f"against {band}; {decide}."
        )
    else:
        head = (
            f"OK: {who} against its baseline, {of}: {move} ({change}; {at_most}), "
            f"not slower: {allowed} is ruled out against {band}."
        )
    if comparison.batch_sizes is not None:
        head += f" {as_sentence(per_sample_reason(comparison))}"
    return head + changed


def baseline_words(baseline: list[RunEntry], units: list[StoredJob | None]) -> str:
    """``run @3``, ``5 runs @1–@5``, ``job 3f2a9c1e… (2 ranks, @5 @6; slowest rank 1)``,
    ``3 jobs @2, @5, @8 (each job by its slowest rank)``; the step time a paragraph gives for
    several is the geometric mean of their medians, the centre the noise model judges from."""
    ids = [f"@{r.stored_id}" for r in baseline]
    jobs = sum(u is not None for u in units)
    if len(ids) == 1:
        unit = units[0]
        return f"run {ids[0]}" if unit is None else unit.label()
    if not jobs:
        return f"{len(ids)} runs {fmt_run_span([('@', r.stored_id) for r in baseline])}"
    alone = len(ids) - jobs
    counted = [f"{jobs} job{'s' if jobs != 1 else ''}"]
    if alone:
        counted.append(f"{alone} run{'s' if alone != 1 else ''}")
    return f"{' and '.join(counted)} {', '.join(ids)} (each job by its slowest rank)"
