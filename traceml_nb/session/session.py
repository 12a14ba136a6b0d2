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
import uuid
from typing import Any

from ..engine.options import RunOptions
from ..engine.run import Run
from ..settings import store_setting
from ..tune.prediction import Prediction, prediction_for, prediction_rows, prediction_sentence
from .conclusion import (
    Compared,
    compare_with_earlier,
    conclude,
    conclude_job,
    persist,
    result_of,
)
from .history import History, RunEntry
from .result import Renderer, RunResult


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
        explicit = (chosen is not None and chosen is not True) or bool(store_setting())
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
    def result(self, run: Run, *, log_to: str | list[str] | bool | None = None) -> RunResult:
        """Conclude the ended ``run`` as its :class:`~traceml_nb.engine.run.RunOptions` say
        (the chain of :mod:`.conclusion`): analyse it (``warmup``), compare it with its
        baseline and the earlier runs of its cell (the previous one and the best one) unless
        ``compare`` is False, keep it in the history, write it to the store (``store`` as
        :meth:`store` takes it), log it to the trackers (:meth:`export`; ``log_to=False``
        here: not now) and return its :class:`RunResult`. A store that cannot be written is
        one note in the result."""
        options = run.options
        concluded = conclude(run, options.warmup)
        entry = self.history.add(concluded.entry)
        entry.session_id = self.id
        target = self.store(options.store)
        compared = Compared()
        if options.compare:
            try:
                compared = self._comparisons(entry, target)
            except Exception as exc:  # our bug: the report and the stored run still come
                run.capabilities.note(
                    f"comparisons with earlier runs unavailable ({type(exc).__name__}: {exc})"
                )
        prediction = self.prediction_for(entry)
        if prediction is not None and compared.previous is not None:
            compared.previous.rows.extend(prediction_rows(prediction))
            compared.previous.headline += f"; {prediction_sentence(prediction)}"
        stored = persist(entry, target, self.id)
        if stored.note:
            run.capabilities.note(stored.note)
        if stored.write_s is not None:
            self.last_write_s = stored.write_s
        job, job_ranks = conclude_job(
            run, concluded.analysis.summary, entry.status, stored.stored_id
        )
        result = result_of(
            run,
            concluded,
            compared,
            stored,
            prediction=prediction,
            job=job,
            ranks=job_ranks if job_ranks is not None else concluded.ranks,
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

        own = run.options if run is not None else RunOptions()  # the run's choices come first
        steps = next((s for s in (log_steps, own.log_steps, self.log_steps) if s is not None), None)
        try:
            targets = trackers.resolve_log_to(log_to, own.log_to, self.log_to)
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

    def prediction_for(self, entry: RunEntry) -> Prediction | None:
        """What a tuning of an earlier run of ``entry``'s cell predicted for ``entry``'s
        loader settings, beside what ``entry`` measured (None: no such tuning)."""
        if not self.tunings:
            return None
        return prediction_for(entry, self.tunings, self.history.same_cell(entry))

    def _comparisons(self, entry: RunEntry, target: Any) -> Compared:
        """The run against its baseline, its previous run and its best run
        (:func:`~.conclusion.compare_with_earlier`)."""
        return compare_with_earlier(entry, self.history, self.baseline_for(entry, target), target)

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
