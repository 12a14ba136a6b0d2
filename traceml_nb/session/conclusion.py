"""A run's conclusion, step by step: what :meth:`~.session.Session.result` chains.

1. :func:`conclude`: the ended run analysed (the ranks' report where the kernel only launched
   them), its history entry with the environment, the machine's load and the idle GPU cost;
2. :func:`compare_with_earlier`: the entry against its baseline, its previous run and its best
   run, each judged with the run-to-run noise of the configurations it compares;
3. :func:`persist`: the entry written to the store (its id, or a note saying why not);
4. :func:`conclude_job`: a ``torchrun`` rank's place in its job, the job gathered on rank 0;
5. :func:`result_of`: the :class:`~.result.RunResult` of all of it.

Each step returns what it found; the session keeps the state (history, store, tunings) and
the order. The experiment trackers come last (:meth:`~.session.Session.export`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..analysis.comparison import Comparison
from ..analysis.findings import IdleCost, Summary
from ..analysis.formatting import fmt_run_span
from ..analysis.pipeline import Analysis
from ..analysis.stragglers import RanksSummary
from ..engine.record import RecordSnapshot
from ..engine.run import Run
from ..settings import gpu_price_setting
from ..tune.prediction import Prediction
from .history import History, RunEntry, entry_from
from .result import JobRank, LabelledComparison, Renderer, RunResult

if TYPE_CHECKING:
    from .baselines import Baseline
    from .store import Store


@dataclass
class Concluded:
    """The ended run analysed: the snapshot and analysis the report shows (the straggler's
    where the kernel only launched ranks), the ranks side by side, its history entry (not yet
    added) and its idle GPU cost (None: a CPU run)."""

    snapshot: RecordSnapshot
    analysis: Analysis
    ranks: RanksSummary | None
    entry: RunEntry
    cost: IdleCost | None


@dataclass
class Compared:
    """The run against its baseline, its previous run and its best run (each None where there
    is none), in the order the report shows them."""

    baseline: Comparison | None = None
    previous: Comparison | None = None
    best: Comparison | None = None
    comparisons: list[LabelledComparison] = field(default_factory=list)

    def put_prediction(self, prediction: Prediction | None) -> None:
        """Put a tuning's ``prediction`` for this run beside its comparison with the previous
        run (nowhere when there is no such comparison)."""
        for item in self.comparisons:
            if item.comparison is self.previous:
                item.prediction = prediction


@dataclass
class Stored:
    """The entry's store id (None: not stored), why not ('' / None: stored or storing off) and
    the seconds the write took (None: no write)."""

    stored_id: int | None = None
    note: str | None = None
    write_s: float | None = None


def conclude(run: Run, warmup: str | int) -> Concluded:
    """Step 1: analyse the ended ``run`` and make its history entry."""
    from ..analysis import analyze
    from ..analysis.attribution import other_cpu_share, steal_share
    from ..analysis.cost import idle_cost
    from .environment import capture_environment

    snapshot = run.record.snapshot()
    analysis = analyze(snapshot, run.capabilities, warmup=warmup)
    ranks = None
    if run.ranks:  # the kernel only launched them: the report is the ranks'
        ranks, snapshot, analysis = rank_analysis(run, warmup, snapshot, analysis)
    entry = entry_from(run, analysis)
    entry.environment = capture_environment(run)
    entry.load = {
        "other_cpu_share": other_cpu_share(snapshot.host, entry.environment.get("cpu_count")),
        "steal_share": steal_share(snapshot.host),
    }
    cost = None
    if run.device_kind == "cuda":
        gpu = entry.environment.get("gpu_name")
        cost = idle_cost(analysis.summary, run.elapsed_s, gpu, gpu_price_setting())
    entry.cost = cost.to_dict() if cost is not None else None
    return Concluded(snapshot, analysis, ranks, entry, cost)


def compare_pair(
    before: RunEntry, after: RunEntry, history: History, target: Store | None
) -> Comparison:
    """``after`` against ``before`` (``%traceml compare``, :meth:`.Session.compare`), as the
    report of ``after`` judges it against its previous run: the noise of their configurations
    as ``history``'s and ``target``'s runs made before ``after`` show it (as its report read
    it), and what changed between them with the
    identifiers among the name's runs named apart (:func:`~.baselines.identifiers`)."""
    from ..analysis import compare as compare_runs
    from ..analysis.attribution import what_changed
    from .baselines import identifiers, judging, machine_points
    from .store import StoreError

    try:
        points = machine_points(after, history, target, made_before=True)
        unsettled = identifiers(after.name, history, target)
    except StoreError:  # a store that cannot be read: this session's runs alone
        points = machine_points(after, history, None, made_before=True)
        unsettled = identifiers(after.name, history, None)
    comparison = compare_runs(before, after, **judging(after, [before], points))
    found = what_changed(before, after, verdict=comparison.verdict, unsettled=unsettled)
    comparison.changes = found.lines()
    return comparison


def compare_with_earlier(
    entry: RunEntry, history: History, baseline: Baseline, target: Store | None
) -> Compared:
    """Step 2: ``entry`` against its ``baseline`` (:func:`~.baselines.choose_baseline`), its
    previous run and its best run in ``history``, each judged with the run-to-run noise of the
    configurations it compares (:mod:`.baselines`; ``target``: the store the machine class's
    noise is read from)."""
    from ..analysis import compare as compare_runs
    from ..analysis.attribution import unsettled_of, what_changed
    from ..analysis.baseline import compare_with_baseline
    from ..analysis.configuration import changed_parts
    from .baselines import judging, machine_points

    runs = baseline.runs
    points = machine_points(entry, history, target)
    config = entry.configuration
    previous = history.previous_of(entry)
    best = history.best_of(entry)
    found = Compared()
    same_as_previous = (
        len(runs) == 1
        and previous is not None
        and (runs[0] is previous or runs[0].stored_id == previous.stored_id)
    )
    around = [*runs, *([previous] if previous is not None else []), entry]
    once = {r.stored_id if r.stored_id is not None else id(r): r for r in around}  # a run once
    unsettled = unsettled_of(r for r in once.values() if r.environment)
    if runs and not same_as_previous:
        found.baseline = compare_with_baseline(runs, entry, **judging(entry, runs, points))
        found.baseline.changed_parts = changed_parts(runs[-1].configuration, config)
        changes = what_changed(
            runs[-1],
            entry,
            verdict=found.baseline.verdict,
            baseline_load_share=median_load(runs, "other_cpu_share"),
            baseline_steal_share=median_load(runs, "steal_share"),
            unsettled=unsettled,
        )
        found.baseline.changes = changes.lines()
        if baseline.note:
            found.baseline.note = baseline.note
        title = baseline_title(
            entry,
            runs,
            baseline.kind,
            found.baseline.changed_parts,
            baseline.values,
            baseline.split_by,
        )
        found.comparisons.append(LabelledComparison(title, found.baseline))
    if previous is not None:
        found.previous = compare_runs(previous, entry, **judging(entry, [previous], points))
        found.previous.changed_parts = changed_parts(previous.configuration, config)
        found.previous.changes = what_changed(
            previous, entry, verdict=found.previous.verdict, unsettled=unsettled
        ).lines()
        found.comparisons.append(
            LabelledComparison(f"previous run {previous.label}", found.previous)
        )
    # the best of several runs of this very configuration is only its luckiest: the
    # baseline judges those; the best run is compared where it is another configuration
    if best is not None and best is not previous and best.configuration.key != config.key:
        found.best = compare_runs(best, entry, **judging(entry, [best], points))
        found.best.changed_parts = changed_parts(best.configuration, config)
        found.comparisons.append(LabelledComparison(f"best run {best.label}", found.best))
    return found


def persist(entry: RunEntry, target: Store | None, session_id: str) -> Stored:
    """Step 3: write ``entry`` to the store ``target`` (None: storing is off)."""
    from .store import StoreError

    if target is None:
        return Stored()
    started = time.perf_counter()
    try:
        entry.stored_id = target.add(entry, session=session_id)
    except StoreError as exc:
        return Stored(note=f"this run was not stored: {exc}")
    except Exception as exc:  # our bug: still never the user's cell
        return Stored(note=f"this run was not stored ({type(exc).__name__}: {exc})")
    return Stored(entry.stored_id, None, time.perf_counter() - started)


def result_of(
    run: Run,
    concluded: Concluded,
    compared: Compared,
    stored: Stored,
    *,
    prediction: Prediction | None,
    job: JobRank | None,
    ranks: RanksSummary | None,
    renderer: Renderer | None,
) -> RunResult:
    """Step 5: the :class:`~.result.RunResult` of the steps before."""
    from .result import sample_columns, step_arrays

    analysis, entry = concluded.analysis, concluded.entry
    device = "cpu"
    if run.device_kind == "cuda":
        usable = run.capabilities.ok("gpu_events")
        device = f"cuda:{run.cuda_index}" + ("" if usable else ", not available")
    selection = analysis.selection
    assert selection is not None, "analyze() keeps the steps it chose"
    return RunResult(
        name=run.name,
        status=entry.status,
        error=run.error,
        elapsed_s=run.elapsed_s,
        run_id=entry.id,
        summary=analysis.summary,
        diagnosis=analysis.diagnosis,
        capabilities=run.capabilities,
        steps=step_arrays(concluded.snapshot, selection, analysis.summary.warmup_steps),
        samples=sample_columns(concluded.snapshot),
        device=device,
        comparison=compared.previous,
        comparison_best=compared.best,
        comparisons=compared.comparisons,
        baseline=compared.baseline,
        stored_id=stored.stored_id,
        store_note=stored.note,
        environment=dict(entry.environment),
        cost=concluded.cost,
        prediction=prediction,
        profile=analysis.profile,
        ranks=ranks,
        job=job,
        renderer=renderer,
    )


def median_load(runs: list[RunEntry], key: str) -> float | None:
    """The (upper) median of ``load[key]`` over the runs that measured it, else None."""
    known = sorted(v for v in (r.load.get(key) for r in runs) if v is not None)
    return known[len(known) // 2] if known else None


#: A baseline's title names at most this many of the values that chose its runs.
MAX_NAMED_VALUES = 3
#: How a baseline title names what changed (:func:`~traceml_nb.analysis.configuration.
#: changed_parts` codes), e.g. ``3 runs of the earlier code``.
CHANGED_PART_WORDS = {
    "code": "code",
    "loader": "DataLoader settings",
    "versions": "versions",
    "hardware": "hardware",
}


def values_words(values: str, split_by: Sequence[str]) -> str:
    """``, given the same values (HIDDEN)``, ``, given other arguments (--model)`` for a
    baseline chosen by the values its runs were given (:attr:`.baselines.Baseline.values`),
    else ''."""
    from ..analysis.variants import ARGUMENT_NAMES, ARGUMENTS, is_argument
    from .baselines import SAME_VALUES

    if not values:
        return ""
    which = "the same" if values == SAME_VALUES else "other"
    parts = []
    for kind, names in (
        ("values", [n for n in split_by if not is_argument(n)]),
        ("arguments", [n for n in split_by if is_argument(n)]),
    ):
        named = [n for n in names if n not in (ARGUMENTS, ARGUMENT_NAMES)]
        more = len(named) - MAX_NAMED_VALUES
        listed = ", ".join(named[:MAX_NAMED_VALUES]) + (f" and {more} more" if more > 0 else "")
        if names:
            parts.append(f"{kind} ({listed})" if named else kind)
    return f", given {which} {' and '.join(parts) or 'values'}"


def baseline_title(
    entry: RunEntry,
    baseline: list[RunEntry],
    kind: str = "",
    changed: Sequence[str] = (),
    values: str = "",
    split_by: Sequence[str] = (),
) -> str:
    """``baseline: 5 runs of this configuration of 'resnet' (@3–@7)``, ``baseline: 3 runs of
    the earlier DataLoader settings of 'resnet' (@1–@3)``, ``baseline: run #2 of 'resnet'``
    (pinned runs: ``the pinned baseline``); ``…, given the same values (HIDDEN)`` where values
    told the configuration's runs apart (:func:`values_words`)."""
    from .baselines import EARLIER, PINNED, SAME

    labels = [("@", r.stored_id) if r.origin == "store" else ("#", r.id) for r in baseline]
    earlier = [r for r in baseline if r.session_id is not None and r.session_id != entry.session_id]
    where = ", from an earlier session" if earlier and len(earlier) == len(baseline) else ""
    runs = "1 run" if len(baseline) == 1 else f"{len(baseline)} runs"
    if kind == EARLIER and changed:
        words = " and ".join(CHANGED_PART_WORDS.get(c, c) for c in changed)
        what = f"{runs} of the earlier {words}"
    elif kind == SAME:
        what = f"{runs} of this configuration"
    elif kind == PINNED:
        what = f"the pinned {runs}"
    else:
        what = runs
    given = values_words(values, split_by) if kind in (SAME, EARLIER) else ""
    return f"baseline: {what} of {entry.name!r} ({fmt_run_span(labels)}){where}{given}"


def rank_analysis(
    run: Run, warmup: str | int, snapshot: RecordSnapshot, analysis: Analysis
) -> tuple[RanksSummary, RecordSnapshot, Analysis]:
    """The ranks side by side, and the snapshot and analysis the report shows: the straggler's,
    else the lowest rank's that measured steps (else the kernel's own, as given)."""
    from ..analysis.stragglers import analyze_ranks

    ranks, analyses = analyze_ranks(run.ranks, warmup)
    key = ranks.reported
    if key is None or key not in analyses:
        return ranks, snapshot, analysis
    rec = next(r for r in run.ranks if (r.launch, r.rank) == key)
    whose = "the straggler's" if ranks.straggler else "the lowest rank's with steps"
    run.capabilities.note(
        f"the summary and the diagnosis are rank {key[1]}'s ({whose}): the kernel's process "
        "only launched the ranks"
    )
    return ranks, rec.record.snapshot(), analyses[key]


def conclude_job(
    run: Run, summary: Summary, status: str, stored_id: int | None
) -> tuple[JobRank | None, RanksSummary | None]:
    """A rank of a ``torchrun`` job, stored: its place in the job (None: not a rank of one)
    and, on rank 0, the job's ranks gathered (:mod:`.job`; the note says whose the report
    is, or why it is alone)."""
    from .job import NOT_GATHERED, gather_job, job_note, job_rank, own_figures

    job = job_rank(run)
    if job is None:
        return None, None
    try:
        own = own_figures(job, summary, status, run.error)
        own.stored_id = stored_id
        ranks, note = gather_job(job, own)
        if ranks is not None:
            note = job_note(ranks)
    except Exception as exc:  # our bug: still never the user's script
        ranks, note = None, f"{NOT_GATHERED} ({type(exc).__name__}: {exc})"
        job.why_not = note
    if note:
        run.capabilities.note(note)
    return job, ranks
