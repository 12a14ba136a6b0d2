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

The baseline is the runs of the latest run's configuration, or of the configuration before it,
given its values where values tell the runs apart (:mod:`.baselines`); the noise is theirs, with
what the machine class has shown as a prior.
With ``runs=K`` (``--runs K``: the job trained K times) the latest K runs are judged together,
which one run against a stored baseline cannot match at this machine class's noise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis.attribution import unsettled_of, what_changed
from ..analysis.baseline import compare_with_baseline, is_regression
from ..analysis.comparison import Comparison
from ..analysis.configuration import changed_parts
from ..analysis.formatting import fmt_run_span
from ..analysis.judge import INCONCLUSIVE as INCONCLUSIVE_VERDICT
from ..analysis.noise import estimate_noise, is_busy, log_mean_ms
from ..analysis.thresholds import BASELINE_RUNS, DEFAULT_MAX_SLOWDOWN
from ..analysis.variants import other_values, ranks_own, told_apart, unsettled_names, values_of
from .baselines import (
    PINNED,
    SAME,
    VALUES_WORDS,
    Baseline,
    across_sessions,
    choose_baseline,
    machine_points,
    noise_for,
)
from .environment import hardware_class
from .history import RunEntry
from .store import Store, StoreEmpty, StoreError, resolve_store_path
from .stored_jobs import StoredJob, earlier_jobs, job_of, job_values, split_jobs, step_median_ms

EXIT_OK, EXIT_REGRESSION, EXIT_NO_VERDICT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
PASS, REGRESSION, NO_BASELINE, ERROR = "pass", "regression", "no baseline", "error"
INCONCLUSIVE = "inconclusive"
#: Runs the gate wants stored of a configuration before its noise is its own.
ADVISED_BASELINE_RUNS = 5
#: "No baseline yet" names at most this many of the latest earlier jobs it left out, and why.
LEFT_OUT_SHOWN = 3
#: ``--runs K`` judges the latest K runs together: at most this many (a CI job that trains
#: more often than this is better served by ``ab``).
MAX_CHECK_RUNS = 20
#: ``--baseline-runs N``: a baseline of at most this many runs (or jobs) of the configuration.
MAX_BASELINE_RUNS = 50


@dataclass
class CheckResult:
    """The gate's outcome. ``status``: "pass", "regression", "inconclusive", "no baseline" or
    "error"; ``why``: the reason there is no verdict (a usage error, a store that cannot be
    read, no baseline yet), '' where the runs were judged: ``comparison``, the latest run
    against its baseline, says how (:mod:`traceml_nb.views.check_words` writes its
    paragraph); ``max_slowdown`` the allowed slowdown, a fraction (0.10 = 10%)."""

    exit_code: int
    status: str
    name: str
    why: str
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
    #: the values that chose the baseline's runs (:attr:`.baselines.Baseline.values`), of
    baseline_values: str = ""
    baseline_split_by: tuple[str, ...] = ()  #: ...these names (``--model``, ``HIDDEN``)
    #: ``--runs K``: the K latest runs judged together (oldest first; ``candidate`` is the
    #: latest of them); empty when one run is judged
    candidates: list[RunEntry] = field(default_factory=list)
    #: ...and those of the K left out: they ran on a busy machine while others did not
    left_out: list[RunEntry] = field(default_factory=list)

    @property
    def slowdown(self) -> float | None:
        """The latest run's median step time relative to the baseline's, less 1 (0.2 = 20%
        slower; per sample where the batch size changed), or None."""
        ratio = self.comparison.step_ratio if self.comparison is not None else None
        return None if ratio is None else ratio - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "status": self.status,
            "name": self.name,
            "why": self.why,
            "max_slowdown": self.max_slowdown,
            "store_path": self.store_path,
            "candidate": self.candidate.stored_id if self.candidate is not None else None,
            "candidates": [r.stored_id for r in self.candidates],
            "left_out": [r.stored_id for r in self.left_out],
            "baseline": [r.stored_id for r in self.baseline],
            "slowdown": self.slowdown,
            "comparison": self.comparison.to_dict() if self.comparison is not None else None,
            "changes": list(self.changes),
            "job": self.job.to_dict() if self.job is not None else None,
            "baseline_jobs": [j.to_dict() if j is not None else None for j in self.baseline_jobs],
            "baseline_kind": self.baseline_kind,
            "baseline_values": self.baseline_values,
            "baseline_split_by": list(self.baseline_split_by),
        }


def _whole_number(option: str, value: object, low: int, high: int) -> str:
    """Why ``value`` is no whole number from ``low`` to ``high`` ('' when it is one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"{option} must be a whole number from {low} to {high}, got {value!r}"
    return ""


def _fail(
    name: str, why: str, max_slowdown: float, path: str | None, status: str = ERROR
) -> CheckResult:
    return CheckResult(EXIT_NO_VERDICT, status, name, why, max_slowdown, path)


def check(
    name: str,
    *,
    store: str | os.PathLike[str] | None = None,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    against: str | int = "baseline",
    any_hardware: bool = False,
    runs: int = 1,
    baseline_runs: int = BASELINE_RUNS,
) -> CheckResult:
    """Compare the latest stored run of ``name`` with its baseline (``against="baseline"``:
    the pinned runs, else the last ``baseline_runs`` (default ``BASELINE_RUNS``) completed runs
    of ``name`` on the same hardware class, or any class with ``any_hardware``) or with one
    stored run (``against=17`` or ``"@17"``). ``store``: a path, else ``TRACEML_NB_STORE`` /
    the default. Never raises for a store problem: that is exit code 2 with the reason.

    When the latest run is a rank of a ``torchrun`` job, the job is judged as one unit
    (:mod:`.stored_jobs`): its slowest rank against the slowest ranks of the last
    ``BASELINE_RUNS`` earlier complete jobs of ``name`` of the same world size; a job that is
    not whole (a rank failed or stored no run) has no verdict. A run alone is compared with
    runs that ran alone only.

    ``runs=K``: the CI job trained K times; the latest K stored runs of ``name`` (completed,
    of one configuration, alone) are judged together against the baseline of the first of
    them: the change of the geometric mean of their medians, whose noise is K times smaller
    (:func:`~traceml_nb.analysis.noise.judge_change`); their own scatter joins the noise."""
    if not (isinstance(max_slowdown, (int, float)) and 0 < max_slowdown < 10):
        why = f"--max-slowdown must be a fraction such as 0.10, got {max_slowdown!r}"
        return _fail(name, why, DEFAULT_MAX_SLOWDOWN, None)
    why = _whole_number("--runs", runs, 1, MAX_CHECK_RUNS) or _whole_number(
        "--baseline-runs", baseline_runs, 2, MAX_BASELINE_RUNS
    )
    if why:
        return _fail(name, why, max_slowdown, None)
    path = resolve_store_path(store)
    if path is None:
        why = "storing is off (TRACEML_NB_STORE=off): there are no runs to check"
        return _fail(name, why, max_slowdown, None)
    target = Store(path)
    path = target.path  # what may be shown (a server's password hidden)
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
        candidates: list[RunEntry] = []
        if latest.job_id is not None and runs > 1:
            return _fail(
                name,
                f"--runs {runs} judges runs that ran alone; {name!r} @{latest.stored_id} is a "
                "rank of a torchrun job: check the latest job without --runs",
                max_slowdown,
                path,
            )
        if runs > 1:
            candidates, why = _latest_runs(target, name, latest, runs)
            if why:
                return _fail(name, why, max_slowdown, path)
        first = candidates[0] if candidates else latest
        if latest.job_id is not None:
            job = job_of(split_jobs(target.job_runs(latest.job_id, name=name)), latest.id)
            assert job is not None  # the latest run is in its own job
            unjudged = _unjudged_job(name, job, max_slowdown, path)
            if unjudged is not None:
                return unjudged
            slowest = job.slowest
            assert slowest is not None  # a job without one was not judged, just above
            candidate = slowest
        hardware = None if any_hardware else hardware_class(candidate.environment)
        given = Baseline([])
        if against == "baseline":
            for_baseline = first if job is None else candidate
            given, units, skipped = _baseline(
                target, name, for_baseline, job, hardware, any_hardware, baseline_runs
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
            chosen = target.get(int(text))
            if any(c.stored_id == chosen.stored_id for c in candidates):
                return _fail(
                    name, f"--against @{text} is one of the runs checked", max_slowdown, path
                )
            baseline, units, skipped = _stand_for_jobs(target, [chosen], exclude=job)
            given = Baseline(baseline, "run")
            if not baseline:
                why = skipped[0] if skipped else "not a run to compare with"
                return _fail(name, f"--against @{text}: {why}", max_slowdown, path, NO_BASELINE)
    except StoreEmpty:  # a server's new database: no run stored yet
        why = f"no stored run named {name!r} in {path} (the store is empty: no run was stored yet)"
        return _fail(name, why, max_slowdown, path, NO_BASELINE)
    except StoreError as exc:
        return _fail(name, f"cannot read the store: {exc}", max_slowdown, path)
    who = subject(name, candidate, job, candidates)
    baseline, kind = given.runs, given.kind
    if not baseline:
        return CheckResult(
            EXIT_NO_VERDICT,
            NO_BASELINE,
            name,
            _no_baseline(who, name, candidate, job, skipped, any_hardware),
            max_slowdown,
            path,
            candidate,
            job=job,
        )
    left_out: list[RunEntry] = []
    if len(candidates) > 1 and not all(is_busy(r.load) for r in baseline):
        quiet = [c for c in candidates if not is_busy(c.load)]
        if quiet and len(quiet) < len(candidates):  # as from a baseline: busy runs left out
            left_out = [c for c in candidates if is_busy(c.load)]
            candidates, candidate = quiet, quiet[-1]
    try:  # the candidates' scatter is noise of their configuration too
        points = machine_points(first, None, target, before=first.stored_id, also=candidates)
    except StoreError:
        points = machine_points(first, None, None, also=candidates)
    keys = {candidate.configuration.key, *(r.configuration.key for r in baseline)}
    step_ms = candidate.summary.step_ms_median or 0.0
    if candidates:
        step_ms = log_mean_ms([float(c.summary.step_ms_median or 0.0) for c in candidates])
    judged = candidates or [candidate]
    across = across_sessions(candidate, baseline)
    if job is None:
        noise = noise_for(candidate, keys, points, step_ms, across=across)
    else:  # a job's noise is that of the slowest ranks of earlier jobs
        medians = [r.summary.step_ms_median for r in baseline if r.summary.step_ms_median]
        noise = estimate_noise(
            [medians], step_ms, points, own_configs=sorted(keys), across_sessions=across
        )
    comparison = compare_with_baseline(
        baseline,
        candidate,
        after=candidates or None,
        noise=noise,
        margin=max_slowdown,
        one_sided=True,
        after_busy=any(is_busy(c.load) for c in judged)
        and not all(is_busy(r.load) for r in baseline),
    )
    comparison.changed_parts = changed_parts(baseline[-1].configuration, candidate.configuration)
    unsettled = unsettled_of([*baseline, *judged])
    own = ranks_own([values_of(r.environment) for r in job.runs]) if job is not None else ()
    found = what_changed(
        baseline[-1], candidate, verdict=comparison.verdict, unsettled=unsettled, ranks_own=own
    )
    comparison.changes = changes = found.lines()
    if comparison.step_ratio is None:
        return CheckResult(
            EXIT_NO_VERDICT, ERROR, name, "", max_slowdown, path, candidate, baseline,
            comparison, changes, job, units, candidates=candidates,
        )  # fmt: skip
    regression = is_regression(comparison)
    if regression:
        exit_code, status = EXIT_REGRESSION, REGRESSION
    elif comparison.verdict == INCONCLUSIVE_VERDICT:
        exit_code, status = EXIT_INCONCLUSIVE, INCONCLUSIVE
    else:
        exit_code, status = EXIT_OK, PASS
    return CheckResult(
        exit_code, status, name, "", max_slowdown, path, candidate, baseline, comparison,
        changes, job, units, kind, given.values, given.split_by, candidates, left_out,
    )  # fmt: skip


def subject(
    name: str,
    candidate: RunEntry,
    job: StoredJob | None,
    candidates: list[RunEntry] | None = None,
    left_out: list[RunEntry] | None = None,
) -> str:
    """``'train' @12``; several runs: ``'train' @10–@12 (its latest 3 runs)``, ``… (its
    latest 3 runs; @11 left out: it ran on a busy machine)``; a job: ``'train' job
    3f2a9c1e… (2 ranks, @12 @13; slowest rank 1)``."""
    if job is not None:
        return f"{name!r} {job.label()}"
    every = sorted([*(candidates or []), *(left_out or [])], key=lambda r: r.stored_id or 0)
    if len(every) > 1:
        span = fmt_run_span([("@", r.stored_id) for r in every])
        text = f"{name!r} {span} (its latest {len(every)} runs"
        if left_out:
            ids = " ".join(f"@{r.stored_id}" for r in left_out)
            they = "it" if len(left_out) == 1 else "they"
            text += f"; {ids} left out: {they} ran on a busy machine"
        return text + ")"
    return f"{name!r} @{candidate.stored_id}"


def _latest_runs(target: Store, name: str, latest: RunEntry, k: int) -> tuple[list[RunEntry], str]:
    """The latest ``k`` stored runs of ``name`` (oldest first) when they are ``k`` completed
    runs, each with steady steps, alone, of ``latest``'s configuration and values (but the
    identifiers: a run id); else [] and why not."""
    rows = target.rows(name=name, limit=k)
    given = target.values_given(name)
    identifiers, mine = unsettled_names(given.values()), given.get(latest.stored_id or 0, {})
    want = f"--runs {k}: the latest {k} stored runs of {name!r} are judged together"
    if len(rows) < k:
        return [], f"{want}, and it has {len(rows)}"
    for row in reversed(rows):  # the latest run's own trouble first
        if row.status != "completed":
            why = f"@{row.id} {row.status}"
        elif (row.steady_steps or 0) < 2:
            why = f"@{row.id} measured no steady steps"
        elif row.job_id is not None:
            why = f"@{row.id} is a rank of a torchrun job"
        elif row.config != latest.configuration.key:
            why = f"@{row.id} is of another configuration than @{latest.stored_id}"
        elif row.hardware != hardware_class(latest.environment):
            why = f"@{row.id} ran on another machine class ({row.hardware})"
        elif other := other_values(given.get(row.id, {}), mine, identifiers):
            why = f"@{row.id} was given other values than @{latest.stored_id} ({', '.join(other)})"
        else:
            continue
        return [], (
            f"{want}, and {why}: each must be a completed run of one configuration and values, "
            "alone, on one machine class (the CI job trained that many times in a row)"
        )
    return target.entries([row.id for row in rows]), ""


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
    k: int = BASELINE_RUNS,
) -> tuple[Baseline, list[StoredJob | None], list[str]]:
    """The baseline (its runs oldest first), the job each run stands for (None: a run alone)
    and why earlier jobs were left out. A run alone: :func:`.baselines.
    choose_baseline` (its pins, else its configuration's runs, else the configuration's before
    it; never ranks of a job); a job: its pins, else the slowest ranks of the last complete jobs
    of its world size; ``k`` of them at most."""
    if job is None:
        chosen = choose_baseline(
            candidate, None, target, any_hardware=any_hardware, before=candidate.stored_id, k=k
        )
        runs, units, skipped = _stand_for_jobs(target, chosen.runs)
        return replace(chosen, runs=runs), units, skipped
    if target.pins(name):
        runs = target.baseline(name, hardware=hardware, before=candidate.stored_id, k=k, alone=True)
        runs = [r for r in runs if r.stored_id != candidate.stored_id]
        runs, units, skipped = _stand_for_jobs(target, runs, exclude=job)
        return Baseline(runs, PINNED), units, skipped
    kept, skipped = earlier_jobs(split_jobs(target.job_rows(name)), job, hardware)
    given = target.values_given(name)
    picked, same, split_by = told_apart(
        job_values(job, given), [job_values(j, given) for j, _ in kept]
    )
    kept = [kept[i] for i in picked][-k:]
    by_id = {r.stored_id: r for r in target.entries([row.id for _, row in kept])}
    runs = [by_id[row.id] for _, row in kept]
    return Baseline(runs, SAME, "", VALUES_WORDS[same], split_by), [j for j, _ in kept], skipped


def _stand_for_jobs(
    target: Store, runs: list[RunEntry], *, exclude: StoredJob | None = None
) -> tuple[list[RunEntry], list[StoredJob | None], list[str]]:
    """``runs`` (pinned, or ``--against``) with each rank of a job standing for its job: the
    job's slowest rank, once a job; a partial job, or the candidate job itself, is left out."""
    out: list[RunEntry] = []
    units: list[StoredJob | None] = []
    skipped: list[str] = []
    jobs: dict[str, list[StoredJob[RunEntry]]] = {}
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
        slowest = unit.slowest
        if exclude is not None and set(unit.ids) & set(exclude.ids):
            skipped.append(f"@{run.id} is a rank of the job being checked")
        elif unit.partial_reasons() or slowest is None:
            why = "; ".join(unit.partial_reasons()) or "a rank without steady steps"
            skipped.append(f"@{run.id} is a rank of {unit.label()}, which is partial ({why})")
        else:
            out.append(slowest)
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
