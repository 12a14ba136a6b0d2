"""A ``torchrun`` job in the store as one unit: its ranks' runs, whether it is whole, its
slowest rank.

Each rank of a job stores its own run, tagged with the job's id (``TORCHELASTIC_RUN_ID``), its
rank and the world size. The job's figure is its **slowest rank**: DDP ranks advance at the
slowest rank's pace (the others wait for it at the gradient all-reduce), so that rank's run is
what a comparison reads. As every rank then takes about the same step time, the slowest is the
straggler by its data wait when one stands out (the report's rule), else the rank with the
longest median step.

A job id is not always one job: torchrun's static rendezvous (``--master-port`` given, or
several nodes without ``--rdzv-id``) gives every job the id ``none``, and an elastic restart
keeps the id for the restarted ranks. So :func:`split_jobs` reads the runs of one name and one
job id in the order they were stored and starts a new job where a rank already seen in the
current one stores again. (:mod:`.job` is the other side: a job's ranks gathering their
figures on rank 0 while they run.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..analysis.formatting import fmt_ms
from ..analysis.stragglers import RankFigures, slowest_rank
from ..analysis.variants import ranks_own
from .environment import hardware_class
from .history import RunEntry
from .store_rows import StoredRow

#: A job id is shown cut to this many characters and "…" (a torchrun id is a 36-character UUID).
JOB_ID_CHARS = 8
#: Ranks whose median step times are within this share (1%) of the longest are tied for the
#: slowest. DDP ranks wait for one another at every all-reduce, so their medians differ by noise
#: only (25.5 ms and 25.5 ms for a rank waiting 85% of its step for data and one waiting 10%, in
#: a real 2-rank gloo job); without the tie the "slowest" would flip between ranks from job to
#: job by that noise, and the comparison would set one rank's data wait against another's.
SLOWEST_RANK_TIE = 0.01

#: A rank's stored run: in full (:class:`RunEntry`) or as the store lists it (:class:`StoredRow`).
StoredRun = RunEntry | StoredRow
#: The kind of run a :class:`StoredJob` holds: a job read in full holds :class:`RunEntry`, one
#: read from the store's listing :class:`StoredRow`, never both.
R = TypeVar("R", RunEntry, StoredRow)


def _store_id(run: StoredRun) -> int:
    """The store id of a :class:`RunEntry` or a :class:`~.store_rows.StoredRow`."""
    if isinstance(run, RunEntry):
        return int(run.stored_id if run.stored_id is not None else run.id)
    return int(run.id)


def step_median_ms(run: StoredRun) -> float | None:
    """The median steady step time (ms) of a :class:`RunEntry` or a stored row; None: none."""
    return run.summary.step_ms_median if isinstance(run, RunEntry) else run.step_ms_median


def steady_steps(run: StoredRun) -> int:
    """The steady steps of a :class:`RunEntry` or a stored row (0 where not known)."""
    steps = run.summary.steady_steps if isinstance(run, RunEntry) else run.steady_steps
    return int(steps or 0)


def data_wait_share(run: StoredRun) -> float | None:
    """The data wait share 0..1 of a :class:`RunEntry` or a stored row; None: not measured."""
    return run.summary.data_wait_share if isinstance(run, RunEntry) else run.data_wait_share


def _figures(run: StoredRun) -> RankFigures:
    """A rank's run as the straggler rule reads it (a stored row has no median data wait: its
    share of the median step stands in)."""
    step, share = step_median_ms(run), data_wait_share(run)
    if isinstance(run, RunEntry):
        wait = run.summary.data_wait_ms_median
    else:
        wait = share * step if share is not None and step is not None else None
    return RankFigures(
        run.rank if run.rank is not None else -1,
        steps=steady_steps(run),
        step_ms_median=step,
        data_wait_ms_median=wait,
        data_wait_share=share,
    )


def run_hardware(run: StoredRun) -> str:
    """The hardware class of a :class:`RunEntry` or a stored row."""
    return hardware_class(run.environment) if isinstance(run, RunEntry) else str(run.hardware)


@dataclass
class StoredJob(Generic[R]):
    """The stored runs of one ``torchrun`` job of one name (``runs``: :class:`RunEntry` or
    :class:`~.store_rows.StoredRow`, in rank order, one run a rank)."""

    job_id: str
    runs: list[R]

    @property
    def ids(self) -> list[int]:
        """The ranks' store ids, in rank order."""
        return [_store_id(r) for r in self.runs]

    @property
    def world_size(self) -> int:
        """The ranks the job had: the largest world size its runs state, else one more than
        the largest rank stored, else the runs stored."""
        stated = [r.world_size for r in self.runs if r.world_size is not None]
        if stated:
            return max(stated)
        ranks = [r.rank for r in self.runs if r.rank is not None]
        return max(ranks) + 1 if ranks else len(self.runs)

    @property
    def missing_ranks(self) -> list[int]:
        """The ranks of ``0 .. world_size - 1`` that stored no run."""
        stored = {r.rank for r in self.runs}
        return [k for k in range(self.world_size) if k not in stored]

    @property
    def failed(self) -> list[R]:
        """The ranks' runs that did not complete (failed or interrupted)."""
        return [r for r in self.runs if r.status != "completed"]

    @property
    def complete(self) -> bool:
        """Every rank stored its run and every run completed."""
        return not self.failed and not self.missing_ranks and len(self.runs) == self.world_size

    @property
    def slowest(self) -> R | None:
        """The rank's run the job is judged by
        (:func:`~traceml_nb.analysis.stragglers.slowest_rank`, the rule of the report and the live
        header, ranks within ``SLOWEST_RANK_TIE`` of the longest median tied). None when a rank
        has no median (no steady steps) or no run is stored."""
        if not self.runs or any(step_median_ms(r) is None for r in self.runs):
            return None
        figures = [_figures(r) for r in self.runs]
        found = slowest_rank(figures, SLOWEST_RANK_TIE)
        if found is None:
            return None
        return next(r for r, f in zip(self.runs, figures, strict=True) if f is found[0])

    @property
    def short_id(self) -> str:
        text = self.job_id
        return text if len(text) <= JOB_ID_CHARS + 1 else text[:JOB_ID_CHARS] + "\u2026"

    def rank_label(self, run: StoredRun) -> str:
        return (
            f"rank {run.rank} (@{_store_id(run)})" if run.rank is not None else f"@{_store_id(run)}"
        )

    def label(self) -> str:
        """``job 3f2a9c1e… (2 ranks, @12 @13; slowest rank 1)`` (a partial job: no slowest)."""
        ranks = f"{len(self.runs)} rank{'s' if len(self.runs) != 1 else ''}"
        if len(self.runs) != self.world_size:
            ranks = f"{len(self.runs)} of {self.world_size} ranks"
        slowest = self.slowest if self.complete else None  # of a partial job: not known
        tail = "" if slowest is None else f"; slowest rank {slowest.rank}"
        return f"job {self.short_id} ({ranks}, {' '.join(f'@{i}' for i in self.ids)}{tail})"

    def partial_reasons(self) -> list[str]:
        """What keeps the job from being whole, one phrase each ([] for a complete job)."""
        reasons = []
        for run in self.failed:
            error = getattr(run, "error", None)  # a stored row has none
            why = f": {error}" if error else ""
            reasons.append(f"{self.rank_label(run)} {run.status}{why}")
        missing = self.missing_ranks
        if missing:
            names = ", ".join(str(k) for k in missing)
            reasons.append(f"rank{'s' if len(missing) != 1 else ''} {names} stored no run")
        elif len(self.runs) != self.world_size:
            reasons.append(f"{len(self.runs)} runs stored for {self.world_size} ranks")
        return reasons

    def to_dict(self) -> dict[str, Any]:
        slowest = self.slowest if self.complete else None
        return {
            "job_id": self.job_id,
            "world_size": self.world_size,
            "ids": self.ids,
            "ranks": [
                {
                    "rank": r.rank,
                    "id": _store_id(r),
                    "status": r.status,
                    "step_ms_median": step_median_ms(r),
                }
                for r in self.runs
            ],
            "complete": self.complete,
            # the job's figure: of a complete job only
            "slowest_rank": None if slowest is None else slowest.rank,
            "slowest_id": None if slowest is None else _store_id(slowest),
        }

    def ranks_line(self) -> str:
        """``rank 0 @12 20.1 ms, rank 1 @13 24.0 ms (slowest)``: each rank's median step."""
        slowest = self.slowest if self.complete else None
        parts = []
        for r in self.runs:
            median = step_median_ms(r)
            figure = "no steady steps" if median is None else fmt_ms(median)
            if r.status != "completed":
                figure += f", {r.status}"
            mark = " (slowest)" if r is slowest else ""
            parts.append(f"rank {r.rank} @{_store_id(r)} {figure}{mark}")
        return ", ".join(parts)


def split_jobs(runs: Sequence[R]) -> list[StoredJob[R]]:
    """The runs of one name that belong to jobs (``job_id`` set), as jobs in the order of
    their first stored run: the runs of one job id in store order, a new job where a rank
    already seen stores again (see the module docstring)."""
    jobs: list[StoredJob[R]] = []
    current: dict[str, StoredJob[R]] = {}
    for run in sorted(runs, key=_store_id):
        job_id = run.job_id
        if job_id is None:
            continue
        job = current.get(job_id)
        if job is None or any(r.rank == run.rank for r in job.runs):
            job = current[job_id] = StoredJob(job_id, [])
            jobs.append(job)
        job.runs.append(run)
    for job in jobs:
        job.runs.sort(key=lambda r: (r.rank is None, r.rank or 0, _store_id(r)))
    return jobs


def job_of(jobs: list[StoredJob[R]], run_id: int) -> StoredJob[R] | None:
    """The job of ``jobs`` that holds the run ``run_id``."""
    return next((j for j in jobs if run_id in j.ids), None)


def earlier_jobs(
    jobs: Sequence[StoredJob[StoredRow]], job: StoredJob[Any], hardware: str | None
) -> tuple[list[tuple[StoredJob[StoredRow], StoredRow]], list[str]]:
    """The jobs of ``jobs`` that can be ``job``'s baseline, each with its slowest rank (oldest
    first): complete, of its world size, each rank with steady steps, on ``hardware`` (None:
    any); and why the others of its hardware were left out."""
    kept: list[tuple[StoredJob[StoredRow], StoredRow]] = []
    skipped = []
    for other in jobs:
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
            kept.append((other, slowest))
    return kept, skipped


def job_values(job: StoredJob[Any], given: Mapping[int, Mapping[str, str]]) -> dict[str, str]:
    """The values a job was given (``given``: each stored run's, by id): those every rank was
    given alike. A value that differs between ranks (a ``--local-rank=N`` a launcher passes each
    process) is the rank's, not the job's."""
    return _job_and_ranks_own(job, given)[0]


def jobs_values(
    jobs: Sequence[StoredJob[Any]], given: Mapping[int, Mapping[str, str]]
) -> tuple[dict[int, dict[str, str]], set[str]]:
    """Each of ``jobs``' values (:func:`job_values`) by the store id of its slowest rank (a job
    without one left out), and the names whose values differ between the ranks of any of
    them (:func:`~traceml_nb.analysis.variants.ranks_own`)."""
    values: dict[int, dict[str, str]] = {}
    own: set[str] = set()
    for job in jobs:
        if job.slowest is not None:
            values[_store_id(job.slowest)], ranks = _job_and_ranks_own(job, given)
            own |= ranks
    return values, own


def _job_and_ranks_own(
    job: StoredJob[Any], given: Mapping[int, Mapping[str, str]]
) -> tuple[dict[str, str], set[str]]:
    """The values every rank of ``job`` was given alike, and the names whose values differ
    between its ranks."""
    ranks = [given.get(_store_id(r), {}) for r in job.runs]
    own = ranks_own(ranks)
    return ({n: v for n, v in ranks[0].items() if n not in own} if ranks else {}), own
