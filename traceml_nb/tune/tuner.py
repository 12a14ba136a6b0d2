"""The rounds of a tuning: which candidates are measured, for how long, and when it stops.

1. **First round**: one candidate per worker count, 0 up to the usable CPUs (``--workers``
   chooses them), each for ``FIRST_ROUND_BATCHES`` steady batches. When the candidate with
   the most workers is the best, still cannot keep up with the compute, and its workers were
   idle-waiting (below ``IDLE_WORKER_SHARE`` of a core each), more workers than CPUs are
   tried too (up to twice the CPUs).
2. **Successive halving**: after each round the candidates ``EARLY_DROP_FACTOR`` × slower
   than the best are dropped; the other prefetch and pinning choices are added for the best
   ``VARIANT_WORKER_COUNTS`` worker counts; each later round measures the survivors with
   twice the batches, up to ``MAX_ROUNDS`` rounds.
3. **Budget**: the first round may use ``FIRST_ROUND_BUDGET_SHARE`` of the budget, shared by
   its candidates; a candidate stops at its share; what the budget does not reach is "not
   measured". ``KeyboardInterrupt`` stops it with the results so far (status
   ``"interrupted"``), every worker shut down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..analysis.advice import setting_name, takes
from .candidates import (
    Candidate,
    LoaderSpec,
    extra_worker_counts,
    first_round,
    memory_guard,
    paste_line,
    variants,
    worker_counts,
)
from .constants import (
    FIRST_ROUND_BATCHES,
    FIRST_ROUND_BUDGET_SHARE,
    IDLE_WORKER_SHARE,
    MAX_ROUNDS,
    TUNE_BUDGET_S,
    VARIANT_WORKER_COUNTS,
    WITHIN_BEST_SHARE,
)
from .predict import (
    DROPPED,
    MEASURED,
    MEASURING,
    NOT_MEASURED,
    PENDING,
    SKIPPED,
    Measurement,
    TuneResult,
    best_of,
    drop_slow,
    headroom_note,
    rank_key,
    recommend,
    update_predictions,
)

SHARDING_NOTE = (
    "IterableDataset: only num_workers is tuned. Each worker iterates its own copy of the "
    "dataset: unless its __iter__ shards the stream with torch.utils.data.get_worker_info(), "
    "every worker yields the whole stream and the batches measured include duplicates."
)
SIDE_EFFECTS_NOTE = (
    "Tuning reads items of the dataset (each candidate a few dozen batches): a dataset whose "
    "items have side effects (a stream consumed, a counter, a remote read) sees those reads; "
    "--batches N caps the batches read per candidate."
)


def usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def available_ram() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:
        return None


def tune(
    loader: Any,
    *,
    compute_ms: float | None = None,
    run_step_ms: float | None = None,
    run_wait_ms: float | None = None,
    budget_s: float = TUNE_BUDGET_S,
    workers: Sequence[int] | None = None,
    prefetch: Sequence[int] | None = None,
    batches: int | None = None,
    gpu: bool | None = None,
    cpus: int | None = None,
    current: Candidate | None = None,
    progress: Callable[[TuneResult], None] | None = None,
    ram_available: int | None = None,
    name_of: Callable[[Any], str | None] | None = None,
    driver: str | None = None,
    trains: bool = True,
    run_id: int | None = None,
    run_label: str = "",
    unavailable: dict[str, str] | None = None,
) -> TuneResult:
    """Measure DataLoader settings for ``loader``'s dataset and recommend one.

    ``compute_ms``: the compute time per step of the training (the run's median step time
    less its data wait); without it candidates are ranked by their time between batches.
    ``run_step_ms``/``run_wait_ms``: the run's measured median step time and data wait, shown
    beside the prediction. ``workers``/``prefetch``: the choices to try (default: 0 up to the
    CPUs; 2, 4, 8). ``driver``/``trains``: what built the loader and whether it trains, to
    name its settings as the user sets them (``advice.setting_name``). ``batches``: at most
    this many batches read per candidate and round. ``gpu``: whether the training uses a GPU (pinning is tried then; default: CUDA is
    available). ``progress`` is called with the result so far as each candidate starts and
    ends. ``ram_available`` (bytes) replaces the RAM psutil reports, for the memory guard.
    """
    from .measure import LoaderSource, measure_round, pickle_problem, random_states

    started = time.perf_counter()
    deadline = started + budget_s
    if gpu is None:
        import torch

        gpu = bool(torch.cuda.is_available())
    cpus = cpus if cpus is not None else usable_cpus()
    source = LoaderSource(loader)
    spec: LoaderSpec = source.spec(name_of or (lambda obj: None), driver)
    spec.trains = trains
    if source.iterable:
        prefetch = list(prefetch or ())[:1] or None
    result = TuneResult(
        run_id=run_id,
        run_label=run_label,
        status="running",
        elapsed_s=0.0,
        budget_s=budget_s,
        measurements=[],
        current=current,
        run_step_ms=run_step_ms,
        compute_ms=compute_ms,
        unavailable=dict(unavailable or {}),
        batches_cap=batches,
    )
    if compute_ms is None and "compute_ms" not in result.unavailable:
        result.unavailable["compute_ms"] = "no compute time per step was given"
    problem = pickle_problem(source)
    measurements = result.measurements
    seen: set[Candidate] = set()

    def add(candidates: list[Candidate]) -> None:
        for cand in candidates:
            if cand in seen:
                continue
            seen.add(cand)
            m = Measurement(cand)
            if problem and cand.num_workers:
                m.status, m.reason = SKIPPED, problem
            measurements.append(m)

    def tick() -> None:
        result.elapsed_s = time.perf_counter() - started
        if progress is not None:
            try:
                progress(result)
            except Exception:  # a view that fails must not stop the tuning
                pass

    def batch_bytes() -> int | None:
        return next((m.batch_bytes for m in measurements if m.batch_bytes), None)

    def run_round(todo: list[Measurement], steady: int, share: float) -> bool:
        """Measure ``todo``; False when the budget ran out."""
        ram = ram_available if ram_available is not None else available_ram()
        for i, m in enumerate(todo):
            now = time.perf_counter()
            if now >= deadline:
                for rest in todo[i:]:
                    if rest.status == PENDING:
                        rest.status, rest.reason = NOT_MEASURED, "the budget ran out"
                return False
            why = memory_guard(m.candidate, batch_bytes(), ram)
            if why:
                m.status, m.reason = SKIPPED, why
                tick()
                continue
            allowance = (deadline - now) * share / (len(todo) - i)
            m.status = MEASURING
            tick()
            measure_round(
                source,
                m,
                steady,
                deadline=now + allowance,
                batch_cap=batches,
                consumer_ms=compute_ms,
            )
            update_predictions(measurements, compute_ms, cpus)
            tick()
        return True

    with random_states():
        try:
            add(first_round(worker_counts(cpus, workers), gpu=bool(gpu), prefetch=prefetch))
            pending = [m for m in measurements if m.status == PENDING]
            in_budget = run_round(pending, FIRST_ROUND_BATCHES, FIRST_ROUND_BUDGET_SHARE)
            if in_budget and not workers and not problem:
                extra = _idle_extension(measurements, cpus, compute_ms)
                if extra:
                    add(first_round(extra, gpu=bool(gpu), prefetch=prefetch))
                    pending = [m for m in measurements if m.status == PENDING]
                    in_budget = run_round(pending, FIRST_ROUND_BATCHES, FIRST_ROUND_BUDGET_SHARE)
            for r in range(1, MAX_ROUNDS):
                if not in_budget:
                    break
                drop_slow(measurements)
                survivors = [m for m in measurements if m.status == MEASURED]
                survivors.sort(key=lambda m: (rank_key(m) or 0.0, m.candidate.cost))
                for m in survivors[:VARIANT_WORKER_COUNTS]:
                    if not source.iterable:
                        add(variants(m.candidate, gpu=bool(gpu), prefetch=prefetch))
                todo = [m for m in measurements if m.status in (MEASURED, PENDING)]
                if len(todo) <= 1:
                    break
                share = 1.0 if r == MAX_ROUNDS - 1 else 0.6
                in_budget = run_round(todo, FIRST_ROUND_BATCHES * 2**r, share)
            result.status = "completed"
        except KeyboardInterrupt:
            result.status = "interrupted"
            result.notes.append("interrupted: the results so far; every worker was shut down")
    for m in measurements:
        if m.status in (PENDING, MEASURING):
            if m.steady_batches and m.status == MEASURING:
                m.status = MEASURED
            else:
                m.status = NOT_MEASURED
                m.reason = m.reason or (
                    "interrupted" if result.status == "interrupted" else "the budget ran out"
                )
    update_predictions(measurements, compute_ms, cpus)
    _conclude(result, spec, problem, source.iterable, run_wait_ms)
    result.elapsed_s = time.perf_counter() - started
    return result


def _idle_extension(
    measurements: list[Measurement], cpus: int | None, compute_ms: float | None
) -> list[int]:
    """Worker counts past the CPUs to try: when the best candidate is the one with the most
    workers, its workers were idle-waiting, and it still cannot keep up with the compute (its
    time between batches more than ``WITHIN_BEST_SHARE`` over the compute and its training
    side)."""
    best = best_of(measurements)
    measured = [m for m in measurements if m.usable]
    if best is None or not measured or not cpus:
        return []
    top = max(m.candidate.num_workers for m in measured)
    if best.candidate.num_workers != top or top < cpus:
        return []
    share = best.worker_cpu_share
    if share is None or share >= IDLE_WORKER_SHARE:
        return []
    d, r = best.between_ms, best.training_side_ms
    # no loader gets a step below c + r: one within WITHIN_BEST_SHARE of it already keeps up,
    # and a faster one would not change the recommendation (the cheapest within that share)
    keeping_up_ms = None if compute_ms is None or r is None else compute_ms + r
    if d is not None and keeping_up_ms is not None and d <= keeping_up_ms * (1 + WITHIN_BEST_SHARE):
        return []
    return extra_worker_counts(cpus, [m.candidate.num_workers for m in measurements])


def _conclude(
    result: TuneResult,
    spec: LoaderSpec,
    problem: str | None,
    iterable: bool,
    run_wait_ms: float | None,
) -> None:
    """The recommendation, the line to paste and the notes."""
    from ..analysis.formatting import fmt_ms, fmt_s

    chosen = recommend(result.measurements, compute_ms=result.compute_ms)
    cheaper = recommend(result.measurements, compute_ms=result.compute_ms, headroom=None)
    if problem:
        result.notes.append(problem)
    if iterable:
        result.notes.append(SHARDING_NOTE)
    result.notes.append(SIDE_EFFECTS_NOTE)
    if chosen is None:
        failed = [m for m in result.measurements if m.reason]
        why = failed[0].reason if failed else "no candidate was measured"
        result.notes.insert(0, f"nothing could be measured: {why}")
        if result.status == "completed":
            result.status = "failed"
        return
    result.recommended = chosen.candidate
    result.predicted_ms = chosen.predicted_ms
    result.paste = paste_line(spec, chosen.candidate)
    if cheaper is not chosen and cheaper is not None and result.compute_ms is not None:
        result.notes.append(headroom_note(cheaper, chosen, result.measurements, result.compute_ms))
    keeps = takes(spec.driver, "persistent_workers")
    if chosen.candidate.num_workers and chosen.startup_s is not None and keeps:
        result.persistent_saving_s = chosen.startup_s
        persistent = setting_name("persistent_workers", spec.driver, spec.trains)
        result.notes.append(
            f"{persistent}=True: the workers start once instead of at every epoch "
            f"(their start-up, measured: {fmt_ms(chosen.startup_s * 1e3)})"
        )
    if result.current is not None:
        own = result.measurement_of(result.current)
        if own is not None and own.between_ms is not None and run_wait_ms is not None:
            result.notes.append(
                f"the run's own setting ({result.current.label}) gave a batch every "
                f"{fmt_ms(own.between_ms)} here; in the run its data wait was "
                f"{fmt_ms(run_wait_ms)} a step"
            )
    short = [m for m in result.measurements if m.usable and m.steady_batches < FIRST_ROUND_BATCHES]
    if short and result.status != "interrupted":
        result.notes.append(
            f"the budget ({fmt_s(result.budget_s)}) left {len(short)} candidate"
            f"{'s' if len(short) != 1 else ''} fewer than {FIRST_ROUND_BATCHES} batches: "
            "the ranking is less sure; a larger --budget measures more"
        )
    dropped = sum(m.status == DROPPED for m in result.measurements)
    if dropped:
        result.notes.append(
            f"{dropped} candidate{'s' if dropped != 1 else ''} dropped early: clearly slower "
            "after a few batches"
        )
