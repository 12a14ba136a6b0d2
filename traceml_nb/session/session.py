"""``Session``: the history of a kernel's runs, and what a run means next to the earlier ones.

::

    session = traceml_nb.Session()            # or the kernel's: traceml_nb.default_session()
    with session.run("baseline") as run:       # a Run that reports to this session
        train(model, loader)
    result = run.result()                      # analysed, compared, kept in session.history

The magic holds the kernel's default session; a script or a test may hold its own. This layer
writes no report: the session is given a :class:`~.result.Renderer` (``traceml_nb.Session``
is given the views' report) and passes it on to its results and the trackers.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..engine.run import Run
from .history import History, RunEntry, entry_from
from .result import LabelledComparison, Renderer, RunResult

GPU_PRICE_ENV = "TRACEML_NB_GPU_PRICE"


class Session:
    """The runs of one kernel or script, oldest first (:attr:`history`), and their results.

    ``store``: where runs are stored (:mod:`.store`): a path, ``False`` for none, or ``None``
    for ``TRACEML_NB_STORE`` / the default path, read at each run. ``log_to``: the experiment
    trackers each result is logged to (:mod:`.trackers`: ``"wandb,mlflow,tensorboard:DIR"``;
    None: ``TRACEML_NB_LOG_TO``; a run's own ``log_to`` comes first), ``log_steps`` with the
    per-step series. ``renderer``: writes its results' reports (``str(result)``, the trackers'
    HTML); None: a result prints as its one-line summary and the trackers get no report.
    """

    def __init__(
        self,
        history: History | None = None,
        *,
        store: str | os.PathLike[str] | bool | None = None,
        log_to: str | list[str] | bool | None = None,
        log_steps: bool = False,
        renderer: Renderer | None = None,
    ) -> None:
        self.history = history if history is not None else History()
        self.renderer = renderer
        self.store_option = store
        self.log_to = log_to
        self.log_steps = log_steps
        self.id = uuid.uuid4().hex[:12]  #: this session's id in the store
        self.last_write_s: float | None = None  #: seconds the last store write took
        #: the tunings of this session (``%traceml tune``), oldest first, at most MAX_TUNINGS
        self.tunings: list[Any] = []

    def run(self, name: str | None = None, **options: Any) -> Run:
        """A :class:`~traceml_nb.engine.run.Run` whose :meth:`~traceml_nb.engine.run.Run.result` reports here
        (``options`` as for ``Run``)."""
        return Run(name, session=self, **options)

    # --- the store --------------------------------------------------------------------------
    def store(self, option: str | os.PathLike[str] | bool | None = None) -> Any:
        """The :class:`~.store.Store` runs go to (``option`` as ``--store``/``--no-store``
        give it, else this session's), or None when storing is off."""
        from .store import Store, resolve_store_path

        chosen = option if option is not None else self.store_option
        path = resolve_store_path(chosen)
        if path is None:
            return None
        explicit = (chosen is not None and chosen is not True) or bool(
            os.environ.get("TRACEML_NB_STORE", "").strip()
        )
        return Store(path, create_dir=not explicit)

    def baseline_for(
        self, entry: RunEntry, store: Any = None, *, any_hardware: bool = False
    ) -> Any:
        """The :class:`~.baselines.Baseline` of ``entry`` (:func:`~.baselines.choose_baseline`:
        its pinned runs, else the runs of its configuration, else those of the configuration
        before it; from the store when the run has a stable name and the store can be read,
        else from this session's history)."""
        from .baselines import choose_baseline

        return choose_baseline(entry, self.history, store, any_hardware=any_hardware)

    # --- a run's result ---------------------------------------------------------------------
    def result(
        self,
        run: Run,
        *,
        warmup: str | int = "auto",
        compare: bool = True,
        store: str | os.PathLike[str] | bool | None = None,
        log_to: str | list[str] | bool | None = None,
    ) -> RunResult:
        """Analyse the ended ``run``, compare it with its baseline and the earlier runs of its
        cell (the previous one and the best one) unless ``compare`` is False, keep it in the
        history, write it to the store (``store`` as :meth:`store` takes it), log it to the
        trackers (:meth:`export`; ``log_to=False``: not now) and return its
        :class:`RunResult`. ``warmup``: ``"auto"`` or the number of leading steps to leave out
        of the statistics. A store that cannot be written is one note in the result."""
        from ..analysis import analyze
        from ..analysis.attribution import other_cpu_share, steal_share
        from ..analysis.cost import idle_cost
        from .environment import capture_environment
        from .result import sample_columns, step_arrays

        snapshot = run.record.snapshot()
        analysis = analyze(snapshot, run.capabilities, warmup=warmup)
        ranks = None
        if run.ranks:  # the kernel only launched them: the report is the ranks'
            ranks, snapshot, analysis = _rank_analysis(run, warmup, snapshot, analysis)
        entry = entry_from(run, analysis)
        entry.environment = capture_environment(run)
        entry.load = {
            "other_cpu_share": other_cpu_share(snapshot.host, entry.environment.get("cpu_count")),
            "steal_share": steal_share(snapshot.host),
        }
        cost = (
            idle_cost(
                analysis.summary,
                run.elapsed_s,
                entry.environment.get("gpu_name"),
                os.environ.get(GPU_PRICE_ENV),
            )
            if run.device_kind == "cuda"
            else None
        )
        entry.cost = cost.to_dict() if cost is not None else None
        entry = self.history.add(entry)
        entry.session_id = self.id
        target = self.store(store)
        comparisons: list[LabelledComparison] = []
        with_previous = with_best = with_baseline = None
        if compare:
            try:
                with_baseline, with_previous, with_best, comparisons = self._comparisons(
                    entry, target
                )
            except Exception as exc:  # our bug: the report and the stored run still come
                run.capabilities.note(
                    f"comparisons with earlier runs unavailable ({type(exc).__name__}: {exc})"
                )
        prediction = self.prediction_for(entry)
        if prediction is not None and with_previous is not None:
            with_previous.rows.extend(prediction_rows(prediction))
            with_previous.headline += f"; {prediction_sentence(prediction)}"
        stored_id, store_note = self._write(entry, target)
        if store_note:
            run.capabilities.note(store_note)
        job, job_ranks = _conclude_job(run, analysis.summary, entry.status, stored_id)
        ranks = job_ranks if job_ranks is not None else ranks
        device = "cpu"
        if run.device_kind == "cuda":
            usable = run.capabilities.ok("gpu_events")
            device = f"cuda:{run.cuda_index}" + ("" if usable else ", not available")
        result = RunResult(
            name=run.name,
            status=entry.status,
            error=run.error,
            elapsed_s=run.elapsed_s,
            run_id=entry.id,
            summary=analysis.summary,
            diagnosis=analysis.diagnosis,
            capabilities=run.capabilities,
            steps=step_arrays(snapshot, analysis.selection, analysis.summary.warmup_steps),
            samples=sample_columns(snapshot),
            device=device,
            comparison=with_previous,
            comparison_best=with_best,
            comparisons=comparisons,
            baseline=with_baseline,
            stored_id=stored_id,
            store_note=store_note,
            environment=dict(entry.environment),
            cost=cost,
            prediction=prediction,
            profile=analysis.profile,
            ranks=ranks,
            job=job,
            renderer=self.renderer,
        )
        if log_to is not False:
            for line in self.export(result, log_to, run=run):
                print(line)
        return result

    # --- experiment trackers ----------------------------------------------------------------
    def export(
        self,
        result: RunResult,
        log_to: str | list[str] | bool | None = None,
        *,
        run: Run | None = None,
        log_steps: bool | None = None,
        render: Any = None,
    ) -> list[str]:
        """Log ``result`` to the experiment trackers (:mod:`.trackers`) that ``log_to`` names,
        else ``run``'s, else this session's, else ``TRACEML_NB_LOG_TO``; the lines saying what
        went where (also in ``result.trackers``). ``render``: the HTML report's renderer
        (default: this session's :attr:`renderer`).
        Never raises: a tracker that cannot be used is one line."""
        from . import trackers

        steps = log_steps
        for choice in (getattr(run, "log_steps", None), self.log_steps):
            if steps is None:
                steps = choice
        try:
            targets = trackers.resolve_log_to(log_to, getattr(run, "log_to", None), self.log_to)
        except ValueError as exc:
            lines = [f"traceml: not logged to any tracker: {exc}"]
        else:
            if render is None and self.renderer is not None:
                render = self.renderer.html
            lines = trackers.export(result, targets, log_steps=bool(steps), render=render)
        result.trackers = [*result.trackers, *lines]
        return lines

    # --- tuning -----------------------------------------------------------------------------
    def tune(
        self,
        ref: int | str | None = None,
        *,
        loader: Any = None,
        namespace: dict[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Tune the training DataLoader of run ``ref`` (default: the latest run): measure
        DataLoader settings over its dataset and recommend one (:func:`traceml_nb.tune.tuner.
        tune`; ``options`` as it takes them). ``loader``: the DataLoader to tune, else the live
        one over the run's dataset, looked up in ``namespace`` and then among live objects.
        ``LookupError`` saying why when there is no run or no loader to tune."""
        from ..tune.find import candidate_of, find_loader, namer, training_loader_info
        from ..tune.tuner import tune as run_tune

        if not len(self.history):
            raise LookupError("no run to tune yet: run a training cell under %%traceml first")
        entry = self.get(ref) if ref is not None else self.history.entries[-1]
        info = training_loader_info(entry.loaders)
        name: str | None = None
        if loader is None:
            if info is None:
                raise LookupError(f"run {entry.label} iterated no DataLoader: nothing to tune")
            found = find_loader(info, namespace)
            if found is None:
                raise LookupError(
                    f"the training DataLoader of run {entry.label} ({info.get('dataset_type')}, "
                    f"batch_size={info.get('batch_size')}) is no longer alive; pass it: "
                    "%traceml tune --loader NAME"
                )
            loader, name = found
        s = entry.summary
        unavailable = {}
        if s.compute_ms_median is None:
            unavailable["compute_ms"] = s.unavailable.get(
                "step_ms_median", "the run has no steady steps with a DataLoader"
            )
        result = run_tune(
            loader,
            compute_ms=s.compute_ms_median,
            run_step_ms=s.step_ms_median,
            run_wait_ms=s.data_wait_ms_median,
            gpu=options.pop("gpu", entry.environment.get("device_kind") == "cuda"),
            cpus=options.pop("cpus", s.cpus_available),
            current=candidate_of(info) if info is not None else None,
            name_of=namer(namespace),
            driver=(info or {}).get("driver"),
            run_id=entry.id,
            run_label=entry.label,
            unavailable=unavailable,
            **options,
        )
        result.loader_name = name
        result.cell_entry = entry
        self.tunings = [*self.tunings, result][-MAX_TUNINGS:]
        return result

    def prediction_for(self, entry: RunEntry) -> dict[str, Any] | None:
        """What a tuning of an earlier run of ``entry``'s cell predicted for ``entry``'s
        loader settings, beside what ``entry`` measured (None: no such tuning)."""
        from ..tune.candidates import same_settings
        from ..tune.find import training_loader_info
        from ..tune.predict import predict_for_compute_ms

        info = training_loader_info(entry.loaders)
        if info is None or entry.summary.step_ms_median is None or not self.tunings:
            return None
        earlier = self.history.same_cell(entry)
        for tuning in reversed(self.tunings):
            tuned = getattr(tuning, "cell_entry", None)
            if tuned is None or not any(e is tuned for e in earlier):
                continue
            ordered = sorted(tuning.measurements, key=lambda m: m.candidate != tuning.recommended)
            for m in ordered:
                if m.predicted_ms is not None and same_settings(m.candidate, info):
                    measured = entry.summary.step_ms_median
                    compute = entry.summary.compute_ms_median
                    again = None
                    if tuning.compute_ms and compute is not None:
                        cpus = entry.summary.cpus_available
                        again = predict_for_compute_ms(m, tuning.compute_ms, compute, cpus)
                    return {
                        "tuned_run": tuned.label,
                        "candidate": m.candidate.label,
                        "recommended": m.candidate == tuning.recommended,
                        "predicted_ms": m.predicted_ms,
                        "measured_ms": measured,
                        "error_share": measured / m.predicted_ms - 1,
                        "tuned_compute_ms": tuning.compute_ms,
                        "compute_ms": compute,
                        "predicted_for_compute_ms": again,
                    }
        return None

    def _write(self, entry: RunEntry, target: Any) -> tuple[int | None, str | None]:
        """Store ``entry``: its store id, or a note saying why it was not stored."""
        from .store import StoreError

        if target is None:
            return None, None
        started = time.perf_counter()
        try:
            entry.stored_id = target.add(entry, session=self.id)
        except StoreError as exc:
            return None, f"this run was not stored: {exc}"
        except Exception as exc:  # our bug: still never the user's cell
            return None, f"this run was not stored ({type(exc).__name__}: {exc})"
        self.last_write_s = time.perf_counter() - started
        return entry.stored_id, None

    def _comparisons(
        self, entry: RunEntry, target: Any
    ) -> tuple[Any, Any, Any, list[LabelledComparison]]:
        """The run against its baseline, its previous run and its best run, each judged with
        the run-to-run noise of the configurations it compares (:mod:`.baselines`)."""
        from ..analysis import compare as compare_runs
        from ..analysis.attribution import what_changed
        from ..analysis.baseline import compare_with_baseline
        from ..analysis.configuration import changed_parts
        from ..analysis.noise import is_busy
        from .baselines import machine_points, noise_for

        baseline = self.baseline_for(entry, target)
        runs = baseline.runs
        points = machine_points(entry, self.history, target)
        step_ms = entry.summary.step_ms_median or 0.0
        config = entry.configuration

        def judged(before: list[RunEntry]) -> dict[str, Any]:
            """The keyword arguments that judge ``entry`` against ``before``."""
            keys = {config.key, *(r.configuration.key for r in before)}
            return {
                "noise": noise_for(entry, keys, points, step_ms),
                "after_busy": is_busy(entry.load) and not all(is_busy(r.load) for r in before),
            }

        previous = self.history.previous_of(entry)
        best = self.history.best_of(entry)
        comparisons: list[LabelledComparison] = []
        with_baseline = with_previous = with_best = None
        same_as_previous = (
            len(runs) == 1
            and previous is not None
            and (runs[0] is previous or runs[0].stored_id == previous.stored_id)
        )
        if runs and not same_as_previous:
            with_baseline = compare_with_baseline(runs, entry, **judged(runs))
            with_baseline.changed_parts = changed_parts(runs[-1].configuration, config)
            changes = what_changed(
                runs[-1],
                entry,
                verdict=with_baseline.verdict,
                baseline_load_share=_median_load(runs, "other_cpu_share"),
                baseline_steal_share=_median_load(runs, "steal_share"),
            )
            with_baseline.changes = changes.lines()
            if baseline.note:
                with_baseline.note = baseline.note
            title = baseline_title(entry, runs, baseline.kind, with_baseline.changed_parts)
            comparisons.append(LabelledComparison(title, with_baseline))
        if previous is not None:
            with_previous = compare_runs(previous, entry, **judged([previous]))
            with_previous.changed_parts = changed_parts(previous.configuration, config)
            with_previous.changes = what_changed(
                previous, entry, verdict=with_previous.verdict
            ).lines()
            comparisons.append(LabelledComparison(f"previous run {previous.label}", with_previous))
        # the best of several runs of this very configuration is only its luckiest: the
        # baseline judges those; the best run is compared where it is another configuration
        if best is not None and best is not previous and best.configuration.key != config.key:
            with_best = compare_runs(best, entry, **judged([best]))
            with_best.changed_parts = changed_parts(best.configuration, config)
            comparisons.append(LabelledComparison(f"best run {best.label}", with_best))
        return with_baseline, with_previous, with_best, comparisons

    # --- the history ----------------------------------------------------------------------
    def get(self, ref: int | str) -> RunEntry:
        """A run of the history by number (``3``, ``"#3"``) or name (the latest of that name);
        ``KeyError`` saying what the history has otherwise."""
        return self.history.get(ref)

    def pair(self, before: int | str, after: int | str) -> tuple[RunEntry, RunEntry, str]:
        """The two runs to compare, and a note ('' when there is nothing to say). Where both
        refer to the same run, a name among them is taken as the latest *other* run of that
        name (the note says which), and ``KeyError`` where there is none."""
        first, second = self.get(before), self.get(after)
        if first is not second:
            return first, second, ""
        if not self.history.is_number(before):
            first = self.history.get(before, other_than=second)
            which, ref, run = "first", before, first
        elif not self.history.is_number(after):
            second = self.history.get(after, other_than=first)
            which, ref, run = "second", after, second
        else:
            raise KeyError(f"{before!r} and {after!r} are the same run, {first.label}")
        note = (
            f"the {which} run, {ref!r}, would have been the other run itself: "
            f"compared with the latest other run of that name, {run.label}"
        )
        return first, second, note

    def compare_refs(
        self, before: int | str, after: int | str, *, store: Any = None
    ) -> tuple[RunEntry, RunEntry, str]:
        """Like :meth:`pair`, where a ref may also be a stored run, ``@17`` (read from
        ``store``, default :meth:`store`); the note says when the two runs are on different
        hardware classes."""
        from .environment import hardware_class
        from .store import StoreError

        if not (str(before).startswith("@") or str(after).startswith("@")):
            first, second, note = self.pair(before, after)
        else:
            target = store if store is not None else self.store()
            runs = []
            for ref in (before, after):
                text = str(ref).strip()
                if text.startswith("@"):
                    if target is None:
                        raise KeyError(f"{text}: storing is off, so there are no stored runs")
                    if not text[1:].isdigit():
                        raise KeyError(f"{text!r} is not a stored run id (@ and a number)")
                    try:
                        runs.append(target.get(int(text[1:])))
                    except StoreError as exc:
                        raise KeyError(str(exc)) from None
                else:
                    runs.append(self.get(text))
            first, second, note = runs[0], runs[1], ""
        a, b = hardware_class(first.environment), hardware_class(second.environment)
        if first.environment and second.environment and a != b:
            across = f"across hardware classes: {a} \u2192 {b}"
            note = f"{across}; {note}" if note else across
        return first, second, note

    def compare(self, before: int | str, after: int | str) -> Any:
        """Run ``after`` against run ``before`` (numbers or names, as :meth:`pair` takes
        them)."""
        from ..analysis import compare as compare_runs

        first, second, _ = self.pair(before, after)
        return compare_runs(first, second)

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the history to ``path`` (JSON, atomically); returns the path written."""
        return self.history.save(path)

    def load(self, path: str | os.PathLike[str]) -> int:
        """Replace the history with the runs saved in ``path``; returns how many were loaded."""
        return self.history.load(path)

    def import_to_store(self) -> tuple[int, str | None]:
        """Write the history's runs that are not stored yet (loaded from a JSON file) to the
        store, in one transaction: ``(how many, None)`` or ``(0, why not)``."""
        from .store import StoreError

        target = self.store()
        todo = [e for e in self.history.entries if e.stored_id is None]
        if target is None or not todo:
            return 0, None
        try:
            ids = target.add_many(todo, session=self.id)
        except StoreError as exc:
            return 0, str(exc)
        for entry, stored_id in zip(todo, ids, strict=True):
            entry.stored_id = stored_id
        return len(ids), None

    def clear(self) -> int:
        """Forget every run; returns how many there were."""
        n = len(self.history)
        self.history.clear()
        return n


#: Tunings kept per session (each holds its measurements; the oldest are dropped).
MAX_TUNINGS = 20


def prediction_rows(prediction: dict[str, Any]) -> list[Any]:
    """The comparison rows that put a tuning's prediction beside the measured step time: the
    prediction, and where the model's own compute changed by more than
    ``COMPUTE_CHANGE_SHARE``, the prediction made again for this run's compute."""
    from ..analysis.comparison import NEUTRAL, ComparisonRow
    from ..analysis.formatting import fmt_ms, signed_pct

    measured = prediction["measured_ms"]
    rows = [
        ComparisonRow(
            f"step time predicted by %traceml tune of {prediction['tuned_run']}",
            fmt_ms(prediction["predicted_ms"]),
            fmt_ms(measured),
            signed_pct(prediction["error_share"]),
            NEUTRAL,
        )
    ]
    again = _changed_compute_prediction(prediction)
    if again is not None:
        rows.append(
            ComparisonRow(
                f"step time predicted for this run's compute ({fmt_ms(prediction['compute_ms'])})",
                fmt_ms(again),
                fmt_ms(measured),
                signed_pct(measured / again - 1),
                NEUTRAL,
            )
        )
    return rows


def _changed_compute_prediction(prediction: dict[str, Any]) -> float | None:
    """``predicted_for_compute_ms`` where the compute changed by more than
    ``COMPUTE_CHANGE_SHARE``, else None."""
    from ..tune.constants import COMPUTE_CHANGE_SHARE

    change = compute_change(prediction)
    if change is None or abs(change) <= COMPUTE_CHANGE_SHARE:
        return None
    return prediction.get("predicted_for_compute_ms") or None


def compute_change(prediction: dict[str, Any]) -> float | None:
    """How much the rerun's compute time per step differs from the tuned run's, a share
    (``+0.17``: 17% longer); None where either is unknown."""
    tuned, now = prediction.get("tuned_compute_ms"), prediction.get("compute_ms")
    return None if not tuned or now is None else now / tuned - 1


def prediction_sentence(prediction: dict[str, Any]) -> str:
    """``%traceml tune of #1 predicted 27.2 ms a step for these settings: measured 28.0 ms
    (+3%)``, and where the model's own compute changed by more than ``COMPUTE_CHANGE_SHARE``,
    by how much (the prediction is for the tuned run's compute) and the prediction made again
    for this run's compute (``: for 26.7 ms it is 29.2 ms (measured −3%)``)."""
    from ..analysis.formatting import fmt_ms, signed_pct
    from ..tune.constants import COMPUTE_CHANGE_SHARE

    sentence = (
        f"%traceml tune of {prediction['tuned_run']} predicted {fmt_ms(prediction['predicted_ms'])}"
        f" a step for these settings ({prediction['candidate']}): measured "
        f"{fmt_ms(prediction['measured_ms'])} ({signed_pct(prediction['error_share'])})"
    )
    change = compute_change(prediction)
    if change is not None and abs(change) > COMPUTE_CHANGE_SHARE:
        tuned, now = fmt_ms(prediction["tuned_compute_ms"]), fmt_ms(prediction["compute_ms"])
        sentence += (
            f"; the model's own compute changed too ({tuned} \u2192 {now} a step, "
            f"{signed_pct(change)}), and the prediction was for {tuned}"
        )
        again = prediction.get("predicted_for_compute_ms")
        if again:
            error = prediction["measured_ms"] / again - 1
            sentence += f": for {now} it is {fmt_ms(again)} (measured {signed_pct(error)})"
    return sentence


def _median_load(runs: list[RunEntry], key: str) -> float | None:
    """The (upper) median of ``load[key]`` over the runs that measured it, else None."""
    known = sorted(v for v in (r.load.get(key) for r in runs) if v is not None)
    return known[len(known) // 2] if known else None


#: How a baseline title names what changed (:func:`~traceml_nb.analysis.configuration.
#: changed_parts` codes), e.g. ``3 runs of the earlier code``.
CHANGED_PART_WORDS = {
    "code": "code",
    "loader": "DataLoader settings",
    "versions": "versions",
    "hardware": "hardware",
}


def baseline_title(
    entry: RunEntry, baseline: list[RunEntry], kind: str = "", changed: Sequence[str] = ()
) -> str:
    """``baseline: 5 runs of this configuration of 'resnet' (@3–@7)``, ``baseline: 3 runs of
    the earlier DataLoader settings of 'resnet' (@1–@3)``, ``baseline: run #2 of 'resnet'``
    (pinned runs: ``the pinned baseline``)."""
    from .baselines import EARLIER, PINNED, SAME

    labels = [f"@{r.stored_id}" if r.origin == "store" else f"#{r.id}" for r in baseline]
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
    span = labels[0] if len(labels) == 1 else f"{labels[0]}\u2013{labels[-1]}"
    return f"baseline: {what} of {entry.name!r} ({span}){where}"


def _rank_analysis(run: Run, warmup: Any, snapshot: Any, analysis: Any) -> tuple[Any, Any, Any]:
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


def _conclude_job(run: Run, summary: Any, status: str, stored_id: int | None) -> tuple[Any, Any]:
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
