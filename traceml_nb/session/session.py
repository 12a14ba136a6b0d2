"""``Session``: the history of a kernel's runs, and what a run means next to the earlier ones.

::

    session = traceml_nb.Session()            # or the kernel's: traceml_nb.default_session()
    with session.run("baseline") as run:       # a Run that reports to this session
        train(model, loader)
    result = run.result()                      # analysed, compared, kept in session.history

The magic holds the kernel's default session; a script or a test may hold its own.
"""

from __future__ import annotations

import os
from typing import Any

from ..run import Run
from .history import History, RunEntry, entry_from
from .result import LabelledComparison, RunResult


class Session:
    """The runs of one kernel or script, oldest first (:attr:`history`), and their results."""

    def __init__(self, history: History | None = None) -> None:
        self.history = history if history is not None else History()

    def run(self, name: str | None = None, **options: Any) -> Run:
        """A :class:`~traceml_nb.run.Run` whose :meth:`~traceml_nb.run.Run.result` reports here
        (``options`` as for ``Run``)."""
        return Run(name, session=self, **options)

    def result(self, run: Run, *, warmup: str | int = "auto", compare: bool = True) -> RunResult:
        """Analyse the ended ``run``, compare it with the earlier runs of its cell (the previous
        one and the best one) unless ``compare`` is False, keep it in the history and return
        its :class:`RunResult`. ``warmup``: ``"auto"`` or the number of leading steps to
        leave out of the statistics."""
        from ..analysis import analyze
        from ..analysis import compare as compare_runs
        from .result import sample_columns, step_arrays

        snapshot = run.record.snapshot()
        analysis = analyze(snapshot, run.capabilities, warmup=warmup)
        entry = self.history.add(entry_from(run, analysis))
        with_previous = with_best = None
        comparisons: list[LabelledComparison] = []
        if compare:
            previous = self.history.previous_of(entry)
            best = self.history.best_of(entry)
            if previous is not None:
                with_previous = compare_runs(previous, entry)
                comparisons.append(
                    LabelledComparison(f"previous run {previous.label}", with_previous)
                )
            if best is not None and best is not previous:
                with_best = compare_runs(best, entry)
                comparisons.append(LabelledComparison(f"best run {best.label}", with_best))
        device = "cpu"
        if run.device_kind == "cuda":
            usable = run.capabilities.ok("gpu_events")
            device = f"cuda:{run.cuda_index}" + ("" if usable else ", not available")
        return RunResult(
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
        )

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

    def clear(self) -> int:
        """Forget every run; returns how many there were."""
        n = len(self.history)
        self.history.clear()
        return n


_default: Session | None = None


def default_session() -> Session:
    """The session of this kernel (one per process): the magic's, and that of every ``Run``
    given no session."""
    global _default
    if _default is None:
        _default = Session()
    return _default
