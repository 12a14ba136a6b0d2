"""A ``torchrun`` job's report, once: rank 0 gathers the ranks' figures.

Every rank of a job (``RANK``, ``WORLD_SIZE`` in its environment: :attr:`Run.rank
<traceml_nb.engine.run.Run.rank>`) concludes its own run; when a process group of the job's world
size exists, each then sends its :class:`~traceml_nb.analysis.stragglers.RankFigures` to rank 0
with ``torch.distributed.gather_object``, over a gloo group of our own (so an NCCL job works
too, and our wait is bounded by :data:`GATHER_TIMEOUT_S`, not by the job's own timeout). Rank
0's result then holds the job's ranks side by side; the others' results show one line. Our
failure never reaches the user's script: it is one note, and the rank's own report stands.

Ranks launched from the notebook (:mod:`traceml_nb.engine.rank_launch`) never come here: their runs
only send rows to the kernel, which reports them.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from ..analysis.findings import Summary
from ..analysis.stragglers import RankFigures, RanksSummary, summarize_ranks
from ..engine.run import Run
from .result import JobRank

#: Seconds each rank waits for the other ranks at the gather (creating our gloo group, then
#: ``gather_object``), from the moment it asks for its result. DDP ranks leave their loop
#: together, within a step of each other, and then differ only by the analysis and the store
#: write (at most the store's ``BUSY_TIMEOUT_S`` of 3 s waiting for another rank's write), so
#: they meet within seconds. A rank that died does not need waiting for: the ``torchrun``
#: agent tears the job down. What this bounds is a rank alive that never asks for its result
#: (``if rank == 0: run.result()``): rank 0 then waits this long once, and reports alone.
GATHER_TIMEOUT_S = 30.0

#: Why a job's ranks were not gathered, as the result's note starts it.
NOT_GATHERED = "the job's ranks were not gathered"


def job_rank(run: Run) -> JobRank | None:
    """The run's place in a job (its ``RANK`` and ``WORLD_SIZE``), or None: not a rank of a
    job, or a run that launched ranks itself (the notebook's: its report is theirs)."""
    rank, world = getattr(run, "rank", None), getattr(run, "world_size", None)
    if rank is None or world is None or getattr(run, "ranks", None):
        return None
    return JobRank(rank, world, getattr(run, "job_id", None))


def own_figures(job: JobRank, summary: Summary, status: str, error: str | None) -> RankFigures:
    """This rank's figures as the ranks table shows them (``stored_id`` set by the caller
    once the run is stored)."""

    return RankFigures.of_summary(job.rank, summary, status, error, pid=os.getpid())


def why_not_gathered(job: JobRank, dist: Any) -> str | None:
    """Why the job cannot be gathered now (``dist``: ``torch.distributed``), or None."""
    if job.world_size < 2:
        return "the job has one rank"
    if not dist.is_available():
        return "this PyTorch has no torch.distributed"
    if not dist.is_initialized():
        return (
            "no process group (torch.distributed.init_process_group was not called, or "
            "destroy_process_group() ran before run.result())"
        )
    size, rank = dist.get_world_size(), dist.get_rank()
    if size != job.world_size or rank != job.rank:
        return (
            f"the process group is rank {rank} of {size}, the environment says rank "
            f"{job.rank} of {job.world_size}"
        )
    if not dist.is_gloo_available():
        return "this PyTorch has no gloo backend"
    return None


def failure_reason(exc: BaseException, timeout_s: float) -> str:
    """What a failed gather says: a timeout as the ranks that did not come, else the error."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "timeout" in text.lower() or "timed out" in text.lower():
        return (
            f"not every rank asked for its result within {timeout_s:g} s (GATHER_TIMEOUT_S); "
            "call run.result() on every rank, before destroy_process_group()"
        )
    if len(text) > 200:
        text = text[:199] + "\u2026"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def gather_figures(
    own: RankFigures, world_size: int, timeout_s: float, dist: Any
) -> list[RankFigures] | None:
    """Every rank's figures, in rank order, on rank 0 (None on the others): a gloo group of
    all ranks made for this and destroyed after. Raises what torch raises."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    received: list[Any] | None = [None] * world_size if own.rank == 0 else None
    try:
        dist.gather_object(own.to_dict(), received, dst=0, group=group)
    finally:
        try:
            dist.destroy_process_group(group)
        except Exception:
            pass  # the group of a failed gather may be broken already: nothing left to free
    if received is None:
        return None
    figures = [RankFigures.from_dict(item) for item in received]
    if sorted(f.rank for f in figures) != list(range(world_size)):
        raise ValueError(f"the ranks sent ranks {sorted(f.rank for f in figures)}")
    return sorted(figures, key=lambda f: f.rank)


def gather_job(
    job: JobRank, own: RankFigures, timeout_s: float | None = None
) -> tuple[RanksSummary | None, str | None]:
    """Gather the job's figures on rank 0: ``(the job's ranks on rank 0, else None; the note
    saying why they were not gathered, else None)``; fills ``job.gathered`` / ``job.why_not``.
    Never raises: our failure is the note. No note for a job of one rank."""
    timeout = GATHER_TIMEOUT_S if timeout_s is None else timeout_s
    figures: list[RankFigures] | None = None
    try:
        import torch.distributed as dist

        why = why_not_gathered(job, dist)
        if why is None:
            figures = gather_figures(own, job.world_size, timeout, dist)
    except Exception as exc:
        why = failure_reason(exc, timeout)
    if why is not None:
        job.why_not = why
        note = f"{NOT_GATHERED}: {why}; this report is rank {job.rank}'s own"
        return None, (note if job.world_size > 1 else None)
    job.gathered = True
    if figures is None:
        return None, None
    ranks = summarize_ranks(figures)
    ranks.reported = (0, job.rank)
    return ranks, None


def job_note(ranks: RanksSummary) -> str:
    """Rank 0's note: whose the summary and the diagnosis are, and where the straggler's
    own report is."""
    note = (
        f"the summary and the diagnosis are rank 0's own; the ranks table is the job's, "
        f"{len(ranks.ranks)} ranks gathered with torch.distributed"
    )
    straggler = ranks.straggler
    if straggler is not None and straggler.rank != 0:
        stored = next(
            (f.stored_id for f in ranks.ranks if f.rank == straggler.rank and f.stored_id), None
        )
        if stored is not None:
            note += f"; the straggler's own run is @{stored} in the store"
    return note
