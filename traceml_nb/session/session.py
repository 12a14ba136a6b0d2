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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..engine.options import RunOptions
from ..engine.run import Run
from ..settings import store_setting
from ..tune.prediction import Prediction, prediction_for
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
from .store_place import lost_with_the_runtime

if TYPE_CHECKING:
    from ..analysis.comparison import Comparison
    from ..tune.predict import TuneResult
    from .baselines import Baseline
    from .store import Store


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
        self.tunings: list[TuneResult] = []
        #: the stores this session has said go with the runtime (Colab, Kaggle), by path
        self.place_noted: set[str] = set()

    def run(self, name: str | None = None, **options: Any) -> Run:
        """A :class:`~traceml_nb.engine.run.Run` whose :meth:`~traceml_nb.engine.run.Run.result` reports here
        (``options`` as for ``Run``)."""
        return Run(name, session=self, **options)

    # --- the store --------------------------------------------------------------------------
    def store(self, option: str | os.PathLike[str] | bool | None = None) -> Store | None:
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
        self, entry: RunEntry, store: Store | None = None, *, any_hardware: bool = False
    ) -> Baseline:
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
        here: not now) and return its :class:`RunResult`, whose ``trackers`` say what went
        where. Prints nothing. A store that cannot be written is one note in the result."""
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
        compared.put_prediction(prediction)
        stored = persist(entry, target, self.id)
        if stored.note:
            run.capabilities.note(stored.note)
        if target is not None and not target.server and target.path not in self.place_noted:
            self.place_noted.add(target.path)
            lost = lost_with_the_runtime(target.path)
            if lost:
                run.capabilities.note(lost)
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
            self.export(result, log_to, run=run)
        return result

    # --- experiment trackers ----------------------------------------------------------------
    def export(
        self,
        result: RunResult,
        log_to: str | list[str] | bool | None = None,
        *,
        run: Run | None = None,
        log_steps: bool | None = None,
        render: Callable[[RunResult], str] | None = None,
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
            words = None
            if self.renderer is not None:
                render = render if render is not None else self.renderer.html
                words = self.renderer.diagnosis_words
            lines = trackers.export(
                result, targets, log_steps=bool(steps), render=render, words=words
            )
        result.trackers = [*result.trackers, *lines]
        return lines

    # --- tuning -----------------------------------------------------------------------------
    def tune(self, ref: int | str | None = None, **options: Any) -> TuneResult:
        """Tune the training DataLoader of run ``ref`` (default: the latest run) and keep the
        tuning (:func:`traceml_nb.tune.of_run.tune_run`; ``options``, ``loader`` and
        ``namespace`` among them, as it takes them). ``LookupError`` saying why when there is
        no run or no loader to tune."""
        from ..tune.of_run import tune_run

        if not len(self.history):
            raise LookupError("no run to tune yet: run a training cell under %%traceml first")
        entry = self.get(ref) if ref is not None else self.history.entries[-1]
        result = tune_run(entry, **options)
        self.tunings = [*self.tunings, result][-MAX_TUNINGS:]
        return result

    def prediction_for(self, entry: RunEntry) -> Prediction | None:
        """What a tuning of an earlier run of ``entry``'s cell predicted for ``entry``'s
        loader settings, beside what ``entry`` measured (None: no such tuning)."""
        if not self.tunings:
            return None
        return prediction_for(entry, self.tunings, self.history.same_cell(entry))

    def _comparisons(self, entry: RunEntry, target: Store | None) -> Compared:
        """The run against its baseline, its previous run and its best run
        (:func:`~.conclusion.compare_with_earlier`)."""
        return compare_with_earlier(entry, self.history, self.baseline_for(entry, target), target)

    # --- the history ----------------------------------------------------------------------
    def get(self, ref: int | str) -> RunEntry:
        """A run of the history by number (``3``, ``"#3"``) or name (the latest of that name);
        ``KeyError`` saying what the history has otherwise."""
        return self.history.get(ref)

    def pair(self, before: int | str, after: int | str) -> tuple[RunEntry, RunEntry, str]:
        """The two runs to compare and a note (:func:`~.refs.pair`)."""
        from .refs import pair

        return pair(self.history, before, after)

    def compare_refs(
        self, before: int | str, after: int | str, *, store: Store | None = None
    ) -> tuple[RunEntry, RunEntry, str]:
        """Like :meth:`pair`, where a ref may also be a stored run, ``@17`` (read from
        ``store``, default :meth:`store`; :func:`~.refs.resolve_pair`)."""
        from .refs import resolve_pair

        stored = any(str(ref).startswith("@") for ref in (before, after))
        target = store if store is not None or not stored else self.store()
        return resolve_pair(self.history, before, after, target)

    def compare(self, before: int | str, after: int | str) -> Comparison:
        """Run ``after`` against run ``before`` (numbers or names, as :meth:`pair` takes
        them), judged as :meth:`judge_pair` judges them."""
        first, second, _ = self.pair(before, after)
        return self.judge_pair(first, second)

    def judge_pair(
        self, before: RunEntry, after: RunEntry, *, store: Store | None = None
    ) -> Comparison:
        """``after`` against ``before``, judged as a run's report judges it against its
        previous run: with the noise of their configurations as this session's runs and the
        store's show it (``store``, default :meth:`store`; :func:`~.conclusion.compare_pair`),
        not only the default's, and what changed between them as the report says it."""
        from .conclusion import compare_pair

        return compare_pair(
            before, after, self.history, store if store is not None else self.store()
        )

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
