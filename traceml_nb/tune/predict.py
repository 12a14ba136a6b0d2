"""What a candidate's measurement predicts, which candidates go on, which one to recommend: pure.

**The prediction.** Iterated without the model, a candidate delivers a batch every *d* ms (its
steady time between batches; with workers, each batch is followed by the run's compute time
of the training process kept busy, :func:`.measure.measure_round`, so *d* is at least *c*).
Of that, *r* ms a batch are spent in the training process itself: all of *d* without workers
(the main process makes the batch), and with workers the time to take a ready batch off the
queue (unpickling it, pinning), measured on batches that were waiting.
With the run's compute time per step *c* (its step time less its data wait), the step takes

    predicted = max(c + r, d)

— the compute and the training side of each batch run one after the other, the workers
overlap them — and, where the workers' CPU use was measured, at least ``(w + c) / CPUs``, *w*
the CPU time the workers spent per batch: workers that need the CPU share it with the
training. Without a compute time (a run without steady steps, or the Python API given none)
candidates are ranked by *d* alone and the predicted step time is unavailable, with the reason.
A rerun whose model computed faster or slower gets the prediction made again for its own
compute (:func:`predict_for_compute_ms`).

**The recommendation.** The cheapest candidate within ``WITHIN_BEST_SHARE`` of the best, and
of those the cheapest whose workers have ``LOADING_HEADROOM_SHARE`` of *c* + *r* to spare
(:func:`spare_share`): a loader that keeps up measures *c* + *r* however much it has to spare.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..analysis.formatting import fmt_ms, fmt_s, signed_pct
from .candidates import Candidate
from .constants import EARLY_DROP_FACTOR, LOADING_HEADROOM_SHARE, WITHIN_BEST_SHARE
from .recorded_run import RecordedRun

MEASURING = "measuring"
MEASURED = "measured"
DROPPED = "dropped"
SKIPPED = "skipped"
FAILED = "failed"
NOT_MEASURED = "not measured"
PENDING = "pending"


@dataclass
class Measurement:
    """What was measured of one candidate, over every round it ran in (times in ms/s)."""

    candidate: Candidate
    status: str = PENDING
    reason: str = ""  #: why skipped, dropped, failed or not measured
    startup_s: float | None = None  #: from ``iter(loader)`` to its first batch (worker start-up)
    steady_batches: int = 0  #: batches timed in the steady state, every round
    steady_s: float = 0.0  #: ...and the time they took
    #: the training process's own time per batch of a worker loader (taking a ready batch):
    #: the median of every worker candidate's :attr:`train_side_samples` of the same pinning
    #: (what it costs depends on the batch and the pinning, not on how many workers made it)
    train_side_ms: float | None = None
    train_side_samples: list[float] = field(default_factory=list)  #: ms, this candidate's own
    #: each worker's CPU use while the loader was iterated, a share of one core (None: unavailable)
    worker_cpu_share: float | None = None
    worker_cpu_ms_per_batch: float | None = None  #: the workers' CPU time per batch, summed
    worker_cpu_why: str = ""  #: why the workers' CPU use is unavailable
    rounds: int = 0
    batch_bytes: int | None = None  #: one batch's tensors, bytes
    predicted_ms: float | None = None  #: set by :func:`update_predictions`

    @property
    def between_ms(self) -> float | None:
        """The steady time between batches, ms (None before a steady batch was timed)."""
        if not self.steady_batches:
            return None
        return self.steady_s * 1e3 / self.steady_batches

    @property
    def training_side_ms(self) -> float | None:
        """*r*: all of the time between batches without workers; the measured cost of taking a
        ready batch with workers (0 when it could not be measured)."""
        if self.candidate.num_workers == 0:
            return self.between_ms
        return self.train_side_ms if self.train_side_ms is not None else 0.0

    @property
    def usable(self) -> bool:
        return self.status in (MEASURED, MEASURING, DROPPED) and self.between_ms is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.to_dict(),
            "label": self.candidate.label,
            "status": self.status,
            "reason": self.reason,
            "startup_s": self.startup_s,
            "steady_batches": self.steady_batches,
            "between_ms": self.between_ms,
            "train_side_ms": self.training_side_ms,
            "worker_cpu_share": self.worker_cpu_share,
            "worker_cpu_why": self.worker_cpu_why,
            "rounds": self.rounds,
            "predicted_ms": self.predicted_ms,
        }


def predict_ms(m: Measurement, compute_ms: float | None, cpus: int | None) -> float | None:
    """The predicted step time of ``m``'s candidate (module docstring), None without a
    compute time or a measured time between batches."""
    d, r = m.between_ms, m.training_side_ms
    if d is None or r is None or compute_ms is None:
        return None
    return _step_ms(m, d, r, compute_ms, cpus)


def predict_for_compute_ms(
    m: Measurement, tuned_compute_ms: float, compute_ms: float, cpus: int | None
) -> float | None:
    """The prediction of ``m``'s candidate made again for another compute time per step, ms:
    ``compute_ms`` (a rerun's) where the loader was measured with the tuned run's
    ``tuned_compute_ms``. Workers that kept up (*d* within ``WITHIN_BEST_SHARE`` of
    *c* + *r*) delivered each batch when the paced consumer asked for it, so their *d* moves
    with the compute; workers that did not keep up deliver at their own pace, and a loader
    without workers is the main process's own fetch: their *d* stays as measured. None where
    the measurement has no time between batches."""
    d, r = m.between_ms, m.training_side_ms
    if d is None or r is None:
        return None
    if m.candidate.num_workers and d <= (tuned_compute_ms + r) * (1 + WITHIN_BEST_SHARE):
        d += compute_ms - tuned_compute_ms
    return _step_ms(m, d, r, compute_ms, cpus)


def _step_ms(m: Measurement, d: float, r: float, compute_ms: float, cpus: int | None) -> float:
    """max(*c* + *r*, *d*), and with workers whose CPU use was measured at least
    (*w* + *c*) / CPUs (module docstring), ms."""
    predicted = max(compute_ms + r, d)
    if m.candidate.num_workers and m.worker_cpu_ms_per_batch is not None and cpus:
        predicted = max(predicted, (m.worker_cpu_ms_per_batch + compute_ms) / cpus)
    return predicted


def rank_key(m: Measurement) -> float | None:
    """What candidates are ranked by: the predicted step time, else the time between batches."""
    return m.predicted_ms if m.predicted_ms is not None else m.between_ms


def update_predictions(
    measurements: list[Measurement], compute_ms: float | None, cpus: int | None
) -> None:
    """Pool the training-side samples of the worker candidates (by pinning), then predict."""
    pools: dict[bool, list[float]] = {}
    for m in measurements:
        if m.candidate.num_workers:
            pools.setdefault(m.candidate.pin_memory, []).extend(m.train_side_samples)
    for m in measurements:
        pool = pools.get(m.candidate.pin_memory)
        if m.candidate.num_workers and pool:
            m.train_side_ms = statistics.median(pool)
    for m in measurements:
        m.predicted_ms = predict_ms(m, compute_ms, cpus) if m.usable else None


def best_of(measurements: list[Measurement]) -> Measurement | None:
    """The usable measurement with the lowest :func:`rank_key` (None: none is usable)."""
    ranked = [m for m in measurements if m.usable and rank_key(m) is not None]
    return min(ranked, key=lambda m: (rank_key(m), m.candidate.cost)) if ranked else None


def drop_slow(
    measurements: list[Measurement], factor: float = EARLY_DROP_FACTOR
) -> list[Measurement]:
    """Mark the measured candidates at least ``factor`` × slower than the best as dropped (and
    return them): successive halving's early drop."""
    best = best_of(measurements)
    if best is None:
        return []
    top = rank_key(best)
    assert top is not None
    dropped = []
    for m in measurements:
        key = rank_key(m)
        if m.status == MEASURED and key is not None and m is not best and key >= factor * top:
            m.status = DROPPED
            m.reason = (
                f"{fmt_ms(key)} after {m.steady_batches} batches, "
                f"{key / top:.2f}\u00d7 the best ({fmt_ms(top)})"
            )
            dropped.append(m)
    return dropped


def making_ms(measurements: list[Measurement]) -> float | None:
    """About what one worker takes to make a batch, ms: the time between batches of a loader
    without workers, which makes each batch in the training process (None: none measured)."""
    made = [m.between_ms for m in measurements if not m.candidate.num_workers and m.usable]
    return min(ms for ms in made if ms is not None) if made else None


def worker_batch_ms(m: Measurement, making: float | None) -> float | None:
    """What one of ``m``'s workers takes to make a batch at least, ms: ``making`` (the time
    without workers, :func:`making_ms`) or the CPU time the workers were measured to spend on
    one, whichever is longer (None: neither known)."""
    made = [ms for ms in (making, m.worker_cpu_ms_per_batch) if ms is not None]
    return max(made) if made else None


def spare_share(m: Measurement, making: float | None, compute_ms: float | None) -> float | None:
    """The share of the training's time per batch (*c* + *r*) that ``m``'s workers would have
    to spare at best: 1 − :func:`worker_batch_ms` / workers / (*c* + *r*). None without
    workers, a compute time or a time to make a batch."""
    r, made = m.training_side_ms, worker_batch_ms(m, making)
    if not m.candidate.num_workers or compute_ms is None or r is None or made is None:
        return None
    return 1 - made / m.candidate.num_workers / (compute_ms + r)


def recommend(
    measurements: list[Measurement],
    within: float = WITHIN_BEST_SHARE,
    *,
    compute_ms: float | None = None,
    headroom: float | None = LOADING_HEADROOM_SHARE,
) -> Measurement | None:
    """The cheapest candidate (:attr:`Candidate.cost`) ranked within ``within`` of the best,
    of those whose workers have ``headroom`` to spare (:func:`spare_share`, where known) if
    any has; ``headroom=None`` leaves the spare out."""
    best = best_of(measurements)
    if best is None:
        return None
    top = rank_key(best)
    assert top is not None
    close = [
        m
        for m in measurements
        if m.usable and (key := rank_key(m)) is not None and key <= top * (1 + within)
    ]
    if headroom is not None:
        making = making_ms(measurements)
        roomy = [
            m
            for m in close
            if (spare := spare_share(m, making, compute_ms)) is None or spare >= headroom
        ]
        close = roomy or close
    return min(close, key=lambda m: m.candidate.cost)


def headroom_note(
    passed_over: Measurement,
    chosen: Measurement,
    measurements: list[Measurement],
    compute_ms: float,
) -> str:
    """Why ``chosen`` was recommended over the cheaper ``passed_over``, which kept up as well
    but with less than ``LOADING_HEADROOM_SHARE`` to spare (:func:`recommend`)."""
    making = making_ms(measurements)
    made, spare = worker_batch_ms(passed_over, making), spare_share(passed_over, making, compute_ms)
    assert made is not None and spare is not None and passed_over.training_side_ms is not None
    workers = passed_over.candidate.num_workers
    return (
        f"{chosen.candidate.label} rather than {passed_over.candidate.label}, which kept up as "
        f"well here but with {spare:.0%} to spare: a worker makes a batch in about "
        f"{fmt_ms(made)}, so {passed_over.candidate.num_workers_label} "
        f"{'delivers' if workers == 1 else 'deliver'} one every {fmt_ms(made / workers)} at best, "
        f"and the training takes {fmt_ms(compute_ms + passed_over.training_side_ms)} a batch; "
        f"a rerun whose model computes {LOADING_HEADROOM_SHARE:.0%} faster (reruns have) "
        "would wait for data again"
    )


@dataclass
class TuneResult:
    """The outcome of one tuning: every candidate's measurement and the recommendation.

    ``status`` is ``"completed"``, ``"interrupted"`` (stopped with the results so far) or
    ``"failed"`` (nothing could be measured, ``notes`` say why). ``run_step_ms`` and
    ``compute_ms`` are the tuned run's measured median step time and compute time per step
    (None when unavailable, the reason in ``unavailable``).
    """

    run_id: int | None
    run_label: str
    status: str
    elapsed_s: float
    budget_s: float
    measurements: list[Measurement]
    current: Candidate | None  #: the run's own loader settings
    recommended: Candidate | None = None
    predicted_ms: float | None = None  #: the recommendation's predicted step time
    run_step_ms: float | None = None
    compute_ms: float | None = None
    paste: str | None = None  #: the DataLoader line to paste
    persistent_saving_s: float | None = None  #: worker start-up saved per later epoch
    notes: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    batches_cap: int | None = None
    loader_name: str | None = None  #: the tuned loader's variable name, when known
    #: the session's entry of the tuned run (the comparison of a rerun finds the tuning by it)
    cell_entry: RecordedRun | None = field(default=None, repr=False, compare=False)

    @property
    def saving_share(self) -> float | None:
        """1 − predicted / the run's measured step time (None when either is unavailable)."""
        if self.predicted_ms is None or not self.run_step_ms:
            return None
        return 1 - self.predicted_ms / self.run_step_ms

    def measurement_of(self, candidate: Candidate) -> Measurement | None:
        return next((m for m in self.measurements if m.candidate == candidate), None)

    def headline(self) -> str:
        """One line: what to change and what it should give."""
        if self.recommended is None:
            why = self.notes[0] if self.notes else "no candidate could be measured"
            return f"no recommendation: {why}"
        text = f"recommended: {self.recommended.label}"
        if self.predicted_ms is not None:
            text += f", predicted step {fmt_ms(self.predicted_ms)}"
            if self.run_step_ms is not None:
                text += (
                    f" (the run measured {fmt_ms(self.run_step_ms)}, "
                    f"{signed_pct(self.predicted_ms / self.run_step_ms - 1)})"
                )
        else:
            best = self.measurement_of(self.recommended)
            if best is not None and best.between_ms is not None:
                text += f", a batch every {fmt_ms(best.between_ms)} iterated"
        return text

    def progress_text(self) -> str:
        done = sum(m.status not in (PENDING, MEASURING) for m in self.measurements)
        return (
            f"{done} of {len(self.measurements)} candidates, {fmt_s(self.elapsed_s)} of "
            f"{fmt_s(self.budget_s)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_label": self.run_label,
            "status": self.status,
            "elapsed_s": self.elapsed_s,
            "budget_s": self.budget_s,
            "current": self.current.to_dict() if self.current else None,
            "recommended": self.recommended.to_dict() if self.recommended else None,
            "predicted_ms": self.predicted_ms,
            "run_step_ms": self.run_step_ms,
            "compute_ms": self.compute_ms,
            "saving_share": self.saving_share,
            "paste": self.paste,
            "persistent_saving_s": self.persistent_saving_s,
            "notes": list(self.notes),
            "unavailable": dict(self.unavailable),
            "batches_cap": self.batches_cap,
            "measurements": [m.to_dict() for m in self.measurements],
        }
