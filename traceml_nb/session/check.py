"""The CI gate: is the latest stored run of a name slower than its baseline?

:func:`check` reads the store (never writes it) and returns a :class:`CheckResult` whose
``exit_code`` is what ``python -m traceml_nb check`` exits with:

* **0** not slower: a slowdown of ``max_slowdown`` is ruled out (:mod:`..analysis.judge`:
  the upper bound at ``1 - MISS_RATE`` is below it);
* **1** a regression: slower with confidence (the lower bound at ``1 - FALSE_ALARM_RATE`` is
  above no change, the estimate at least half of ``max_slowdown``, and the step-level
  bootstrap agrees);
* **2** no verdict: no run or no baseline yet, a latest run without steady steps, a usage
  error, or a store that cannot be read;
* **3** inconclusive: the run-to-run noise is too wide to tell; the verdict says how many
  more runs would decide.

The baseline is the runs of the latest run's configuration, or of the configuration before it
(:mod:`.baselines`); the noise is theirs, with what the machine class has shown as a prior.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..analysis.attribution import what_changed
from ..analysis.baseline import compare_with_baseline, is_regression
from ..analysis.comparison import Comparison, fmt_pct_plain, noise_source
from ..analysis.configuration import changed_parts
from ..analysis.formatting import fmt_confidence, fmt_ms, signed_pct, signed_pct_fine
from ..analysis.judge import INCONCLUSIVE as INCONCLUSIVE_VERDICT
from ..analysis.noise import estimate_noise, is_busy
from ..analysis.thresholds import (
    BASELINE_RUNS,
    DEFAULT_MAX_SLOWDOWN,
    FALSE_ALARM_RATE,
    MISS_RATE,
)
from .baselines import EARLIER, SAME, choose_baseline, machine_points, noise_for
from .environment import hardware_class
from .history import RunEntry
from .store import Store, StoreError, resolve_store_path
from .stored_jobs import StoredJob, job_of, run_hardware, split_jobs, steady_steps, step_median_ms

EXIT_OK, EXIT_REGRESSION, EXIT_NO_VERDICT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
PASS, REGRESSION, NO_BASELINE, ERROR = "pass", "regression", "no baseline", "error"
INCONCLUSIVE = "inconclusive"
#: Runs the gate wants stored of a configuration before its noise is its own.
ADVISED_BASELINE_RUNS = 5
#: "No baseline yet" names at most this many of the latest earlier jobs it left out, and why.
LEFT_OUT_SHOWN = 3


@dataclass
class CheckResult:
    """The gate's outcome. ``status``: "pass", "regression", "inconclusive", "no baseline" or
    "error";
    ``verdict``: one paragraph saying it; ``comparison`` the latest run against its baseline
    (None without one); ``max_slowdown`` the allowed slowdown, a fraction (0.10 = 10%)."""

    exit_code: int
    status: str
    name: str
    verdict: str
    max_slowdown: float
    store_path: str | None = None
    candidate: RunEntry | None = None
    baseline: list[RunEntry] = field(default_factory=list)
    comparison: Comparison | None = None
    changes: list[str] = field(default_factory=list)
    #: the ``torchrun`` job checked (None: a run alone); ``candidate`` is its slowest rank
    job: StoredJob | None = None
    #: the job each baseline run stands for (None: a run alone), parallel to ``baseline``
    baseline_jobs: list[StoredJob | None] = field(default_factory=list)
    #: which baseline it is: "same configuration", "earlier configuration" or "pinned"
    baseline_kind: str = SAME

    @property
    def slowdown(self) -> float | None:
        """The latest run's median step time relative to the baseline's, less 1 (0.2 = 20%
        slower), or None."""
        ratio = self.comparison.step_ratio if self.comparison is not None else None
        return None if ratio is None else ratio - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "status": self.status,
            "name": self.name,
            "verdict": self.verdict,
            "max_slowdown": self.max_slowdown,
            "store_path": self.store_path,
            "candidate": self.candidate.stored_id if self.candidate is not None else None,
            "baseline": [r.stored_id for r in self.baseline],
            "slowdown": self.slowdown,
            "comparison": self.comparison.to_dict() if self.comparison is not None else None,
            "changes": list(self.changes),
            "job": self.job.to_dict() if self.job is not None else None,
            "baseline_jobs": [j.to_dict() if j is not None else None for j in self.baseline_jobs],
            "baseline_kind": self.baseline_kind,
        }


def _fail(name: str, why: str, max_slowdown: float, path: str | None, status: str = ERROR) -> Any:
    return CheckResult(EXIT_NO_VERDICT, status, name, why, max_slowdown, path)


def check(
    name: str,
    *,
    store: str | os.PathLike[str] | None = None,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    against: str | int = "baseline",
    any_hardware: bool = False,
) -> CheckResult:
    """Compare the latest stored run of ``name`` with its baseline (``against="baseline"``:
    the pinned runs, else the last ``BASELINE_RUNS`` completed runs of ``name`` on the same
    hardware class, or any class with ``any_hardware``) or with one stored run
    (``against=17`` or ``"@17"``). ``store``: a path, else ``TRACEML_NB_STORE`` / the default.
    Never raises for a store problem: that is exit code 2 with the reason.

    When the latest run is a rank of a ``torchrun`` job, the job is judged as one unit
    (:mod:`.stored_jobs`): its slowest rank against the slowest ranks of the last
    ``BASELINE_RUNS`` earlier complete jobs of ``name`` of the same world size; a job that is
    not whole (a rank failed or stored no run) has no verdict. A run alone is compared with
    runs that ran alone only."""
    if not (isinstance(max_slowdown, (int, float)) and 0 < max_slowdown < 10):
        return _fail(
            name,
            f"--max-slowdown must be a fraction such as 0.10, got {max_slowdown!r}",
            DEFAULT_MAX_SLOWDOWN,
            None,
        )
    path = resolve_store_path(store)
    if path is None:
        return _fail(
            name,
            "storing is off (TRACEML_NB_STORE=off): there are no runs to check",
            max_slowdown,
            None,
        )
    target = Store(path)
    job: StoredJob | None = None
    units: list[StoredJob | None] = []
    try:
        latest = target.latest(name)
        if latest is None:
            names = ", ".join(repr(n) for n in target.names()[:10]) or "none"
            return _fail(
                name,
                f"no stored run named {name!r} in {path} (names stored: {names})",
                max_slowdown,
                path,
                NO_BASELINE,
            )
        candidate = latest
        if latest.job_id is not None:
            job = job_of(split_jobs(target.job_runs(latest.job_id, name=name)), latest.id)
            assert job is not None  # the latest run is in its own job
            unjudged = _unjudged_job(name, job, max_slowdown, path)
            if unjudged is not None:
                return unjudged
            candidate = job.slowest
        hardware = None if any_hardware else hardware_class(candidate.environment)
        kind = SAME
        if against == "baseline":
            baseline, units, skipped, kind = _baseline(
                target, name, candidate, job, hardware, any_hardware
            )
        else:
            text = str(against).strip().lstrip("@")
            if not text.isdigit():
                return _fail(
                    name,
                    f"--against must be 'baseline' or a stored run id, got {against!r}",
                    max_slowdown,
                    path,
                )
            baseline, units, skipped = _stand_for_jobs(target, [target.get(int(text))], exclude=job)
            kind = "run"
            if not baseline:
                why = skipped[0] if skipped else "not a run to compare with"
                return _fail(name, f"--against @{text}: {why}", max_slowdown, path, NO_BASELINE)
    except StoreError as exc:
        return _fail(name, f"cannot read the store: {exc}", max_slowdown, path)
    subject = _subject(name, candidate, job)
    if not baseline:
        return CheckResult(
            EXIT_NO_VERDICT,
            NO_BASELINE,
            name,
            _no_baseline(subject, name, candidate, job, skipped, any_hardware),
            max_slowdown,
            path,
            candidate,
            job=job,
        )
    try:
        points = machine_points(candidate, None, target, before=candidate.stored_id)
    except StoreError:
        points = []
    keys = {candidate.configuration.key, *(r.configuration.key for r in baseline)}
    step_ms = candidate.summary.step_ms_median or 0.0
    if job is None:
        noise = noise_for(candidate, keys, points, step_ms)
    else:  # a job's noise is that of the slowest ranks of earlier jobs
        medians = [r.summary.step_ms_median for r in baseline if r.summary.step_ms_median]
        noise = estimate_noise([medians], step_ms, points, own_configs=sorted(keys))
    comparison = compare_with_baseline(
        baseline,
        candidate,
        noise=noise,
        margin=max_slowdown,
        one_sided=True,
        after_busy=is_busy(candidate.load) and not all(is_busy(r.load) for r in baseline),
    )
    comparison.changed_parts = changed_parts(baseline[-1].configuration, candidate.configuration)
    changes = what_changed(baseline[-1], candidate, verdict=comparison.verdict).lines()
    comparison.changes = changes
    if comparison.step_ratio is None:
        return CheckResult(
            EXIT_NO_VERDICT, ERROR, name,
            f"no verdict on {subject}: {comparison.headline}.",
            max_slowdown, path, candidate, baseline, comparison, changes, job, units,
        )  # fmt: skip
    regression = is_regression(comparison)
    if regression:
        exit_code, status = EXIT_REGRESSION, REGRESSION
    elif comparison.verdict == INCONCLUSIVE_VERDICT:
        exit_code, status = EXIT_INCONCLUSIVE, INCONCLUSIVE
    else:
        exit_code, status = EXIT_OK, PASS
    return CheckResult(
        exit_code,
        status,
        name,
        verdict_paragraph(
            name, candidate, baseline, comparison, max_slowdown, job=job, units=units, kind=kind
        ),
        max_slowdown,
        path,
        candidate,
        baseline,
        comparison,
        changes,
        job,
        units,
        kind,
    )


def _subject(name: str, candidate: RunEntry, job: StoredJob | None) -> str:
    """``'train' @12``; a job: ``'train' job 3f2a9c1e… (2 ranks, @12 @13; slowest rank 1)``."""
    return f"{name!r} {job.label()}" if job is not None else f"{name!r} @{candidate.stored_id}"


def _unjudged_job(name: str, job: StoredJob, max_slowdown: float, path: str) -> CheckResult | None:
    """The result for a candidate job that cannot be judged (not whole, or a rank without steady
    steps); None when it can."""
    reasons = job.partial_reasons()
    if reasons:
        why = (
            f"no verdict on {name!r} {job.label()}: the job is partial: {'; '.join(reasons)}. "
            "A job is judged only when every rank completed and stored its run."
        )
    elif job.slowest is None:
        empty = [job.rank_label(r) for r in job.runs if step_median_ms(r) is None]
        why = (
            f"no verdict on {name!r} {job.label()}: {', '.join(empty)} measured no steady "
            "steps, so its slowest rank is not known."
        )
    else:
        return None
    return CheckResult(EXIT_NO_VERDICT, ERROR, name, why, max_slowdown, path, job=job)


def _baseline(
    target: Store,
    name: str,
    candidate: RunEntry,
    job: StoredJob | None,
    hardware: str | None,
    any_hardware: bool,
) -> tuple[list[RunEntry], list[StoredJob | None], list[str], str]:
    """The baseline runs (oldest first), the job each stands for (None: a run alone), why
    earlier jobs were left out, and the baseline's kind. A run alone: :func:`.baselines.
    choose_baseline` (its pins, else its configuration's runs, else the configuration's before
    it; never ranks of a job); a job: its pins, else the slowest ranks of the last complete jobs
    of its world size."""
    if job is None:
        chosen = choose_baseline(
            candidate, None, target, any_hardware=any_hardware, before=candidate.stored_id
        )
        return (*_stand_for_jobs(target, chosen.runs), chosen.kind)
    if target.pins(name):
        runs = target.baseline(
            name, hardware=hardware, before=candidate.stored_id, k=BASELINE_RUNS, alone=True
        )
        runs = [r for r in runs if r.stored_id != candidate.stored_id]
        return (*_stand_for_jobs(target, runs, exclude=job), "pinned")
    kept: list[StoredJob] = []
    skipped = []
    for other in split_jobs(target.job_rows(name)):
        slowest = other.slowest
        if set(other.ids) & set(job.ids):
            continue
        if hardware is not None and run_hardware(slowest or other.runs[0]) != hardware:
            continue
        if other.world_size != job.world_size:
            skipped.append(f"{other.label()} had {other.world_size} ranks")
        elif not other.complete:
            skipped.append(f"{other.label()} is partial ({'; '.join(other.partial_reasons())})")
        elif slowest is None or steady_steps(slowest) < 2:
            skipped.append(f"{other.label()} has a rank without steady steps")
        else:
            kept.append(other)
    kept = kept[-BASELINE_RUNS:]
    by_id = {r.stored_id: r for r in target.entries([j.slowest.id for j in kept])}
    units: list[StoredJob | None] = [*kept]
    return [by_id[j.slowest.id] for j in kept], units, skipped, SAME


def _stand_for_jobs(
    target: Store, runs: list[RunEntry], *, exclude: StoredJob | None = None
) -> tuple[list[RunEntry], list[StoredJob | None], list[str]]:
    """``runs`` (pinned, or ``--against``) with each rank of a job standing for its job: the
    job's slowest rank, once a job; a partial job, or the candidate job itself, is left out."""
    out: list[RunEntry] = []
    units: list[StoredJob | None] = []
    skipped: list[str] = []
    jobs: dict[str, list[StoredJob]] = {}
    for run in runs:
        if run.job_id is None:
            out.append(run)
            units.append(None)
            continue
        key = f"{run.name}\0{run.job_id}"
        if key not in jobs:
            jobs[key] = split_jobs(target.job_runs(run.job_id, name=run.name))
        unit = job_of(jobs[key], run.id)
        if unit is None or any(u is unit for u in units):
            continue
        if exclude is not None and set(unit.ids) & set(exclude.ids):
            skipped.append(f"@{run.id} is a rank of the job being checked")
        elif unit.partial_reasons() or unit.slowest is None:
            why = "; ".join(unit.partial_reasons()) or "a rank without steady steps"
            skipped.append(f"@{run.id} is a rank of {unit.label()}, which is partial ({why})")
        else:
            out.append(unit.slowest)
            units.append(unit)
    return out, units, skipped


def _no_baseline(
    subject: str,
    name: str,
    candidate: RunEntry,
    job: StoredJob | None,
    skipped: list[str],
    any_hardware: bool,
) -> str:
    where = "" if any_hardware else f" on {hardware_class(candidate.environment)}"
    store_more = (
        f"Store {ADVISED_BASELINE_RUNS} or more runs of it (e.g. on the main branch) and the "
        "gate has a baseline whose noise it knows."
    )
    if job is None:
        text = (
            f"no baseline yet for {name!r}{where}: @{candidate.stored_id} is its only "
            f"completed run there. {store_more}"
        )
    else:
        text = (
            f"no baseline yet for {subject}{where}: no earlier complete job of {name!r} with "
            f"{job.world_size} ranks there (a job is compared with jobs only, never with runs "
            f"that ran alone). {store_more.replace('runs', 'jobs')}"
        )
    if skipped:
        more = len(skipped) - LEFT_OUT_SHOWN
        tail = f"; and {more} more" if more > 0 else ""
        text += f" Left out: {'; '.join(skipped[-LEFT_OUT_SHOWN:])}{tail}."
    return text


def verdict_paragraph(
    name: str,
    candidate: RunEntry,
    baseline: list[RunEntry],
    comparison: Comparison,
    max_slowdown: float,
    *,
    job: StoredJob | None = None,
    units: list[StoredJob | None] | None = None,
    kind: str = SAME,
) -> str:
    """The gate's verdict in one paragraph. ``job``: the job whose slowest rank ``candidate``
    is; ``units``: the job each baseline run stands for (None: a run alone); ``kind``: the
    baseline's (``EARLIER``: the runs of the configuration before the candidate's)."""
    of = _baseline_words(baseline, units or [None] * len(baseline))
    if kind == EARLIER:
        of += " of the configuration before it"
    subject = _subject(name, candidate, job)
    ratio = comparison.step_ratio
    judgement = comparison.judgement
    if ratio is None or judgement is None:
        if job is None:
            return f"{name!r}: no verdict on @{candidate.stored_id}: {comparison.headline}."
        return f"no verdict on {subject}: {comparison.headline}."
    before = baseline[-1].summary.step_ms_median
    if len(baseline) > 1 and ratio:
        before = (candidate.summary.step_ms_median or 0.0) / ratio
    move = f"{fmt_ms(before)} \u2192 {fmt_ms(candidate.summary.step_ms_median)}"
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
    allowed = f"a slowdown of {fmt_pct_plain(max_slowdown)}"
    what = list(comparison.changes[1:])
    changed = ""
    if what:
        changed = f" What changed: {'; '.join(what)}."
    elif comparison.changes:
        first = comparison.changes[0]
        changed = f" {first[:1].upper()}{first[1:]}"
    if comparison.verdict == "slower":
        head = (
            f"REGRESSION: {subject} is slower than its baseline, {of}: step time {move} "
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
            f"INCONCLUSIVE: {subject} against its baseline, {of}: step time {move} ({change}; "
            f"{at_least}, {at_most}): neither {allowed} nor no slowdown can be ruled out "
            f"against {band}; {decide}."
        )
    else:
        head = (
            f"OK: {subject} against its baseline, {of}: step time {move} ({change}; {at_most}), "
            f"not slower: {allowed} is ruled out against {band}."
        )
    return head + changed


def _baseline_words(baseline: list[RunEntry], units: list[StoredJob | None]) -> str:
    """``run @3``, ``5 runs @1–@5``, ``job 3f2a9c1e… (2 ranks, @5 @6; slowest rank 1)``,
    ``3 jobs @2, @5, @8 (each job by its slowest rank)``; the step time a paragraph gives for
    several is the geometric mean of their medians, the centre the noise model judges from."""
    ids = [f"@{r.stored_id}" for r in baseline]
    jobs = sum(u is not None for u in units)
    if len(ids) == 1:
        unit = units[0]
        return f"run {ids[0]}" if unit is None else unit.label()
    if not jobs:
        return f"{len(ids)} runs {ids[0]}\u2013{ids[-1]}"
    alone = len(ids) - jobs
    counted = [f"{jobs} job{'s' if jobs != 1 else ''}"]
    if alone:
        counted.append(f"{alone} run{'s' if alone != 1 else ''}")
    return f"{' and '.join(counted)} {', '.join(ids)} (each job by its slowest rank)"
