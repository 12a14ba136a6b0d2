"""The input-bound verdict: the steps wait for their batches. Its cause, from the first epoch's
waits, the workers' and the machine's CPU and the loader's settings (too few workers, workers
saturated by decoding, pageable copies, slow storage), and the changes to the user's own
loader that address it (:mod:`.advice`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.record import LoaderInfo
from .advice import Change, change_line, explain_changes, loader_changes, more_workers
from .diagnosis_facts import Facts, confidence
from .findings import Diagnosis
from .formatting import fmt_pct, fmt_share
from .summary import Measurements
from .thresholds import (
    FIRST_EPOCH_FACTOR,
    INPUT_BOUND_SHARE,
    MAX_SUGGESTED_WORKERS,
    STRONG_FACTOR,
    SYSTEM_SATURATED_PCT,
    WORKER_BUSY_PCT,
    WORKER_SATURATED_PCT,
)

CAUSE_TOO_FEW_WORKERS = "too few DataLoader workers"
CAUSE_CPU_SATURATED = "DataLoader workers CPU-saturated (decode/augmentation bound)"
CAUSE_PAGEABLE = "host-to-device copies from pageable memory"
CAUSE_FIRST_EPOCH = "slow storage on the first epoch (later epochs read from the cache)"
CAUSE_STORAGE = "slow storage (the workers are idle, yet cannot keep up)"
CAUSE_UNKNOWN = "input pipeline too slow (worker CPU unavailable)"
#: The last line of the advice of an input-bound run whose DataLoader settings are the cause
#: (or may be): the tuner measures the settings instead of reading them from rules.
TUNE_HINT = (
    "To measure the DataLoader settings instead of following these rules: run %traceml tune "
    "(it iterates fresh loaders over your dataset, never your model; about a minute)."
)
#: The causes whose advice ends with ``TUNE_HINT``.
TUNABLE_CAUSES = (CAUSE_TOO_FEW_WORKERS, CAUSE_PAGEABLE, CAUSE_STORAGE, CAUSE_UNKNOWN)


def _epoch_pattern(m: Measurements) -> tuple[float, float] | None:
    """(first-epoch wait share, later epochs' wait share) when the first epoch waited far more."""
    if m.selection.source != "dataloader":
        return None
    epochs = m.epoch_ids()
    if not len(epochs) or epochs.max() < 1:
        return None
    first = epochs == 0
    first_wall, later_wall = m.wall_ms[first].sum(), m.wall_ms[~first].sum()
    if first_wall <= 0 or later_wall <= 0:
        return None
    first_share = float(m.wait_ms[first].sum() / first_wall)
    later_share = float(m.wait_ms[~first].sum() / later_wall)
    if later_share < INPUT_BOUND_SHARE and first_share >= FIRST_EPOCH_FACTOR * later_share:
        return first_share, later_share
    return None


@dataclass
class _Saturation:
    known: bool  #: at least one CPU reading was available
    saturated: bool
    text: str  #: what the readings say, for the advice


def _saturation(m: Measurements, loader: LoaderInfo) -> _Saturation:
    r = m.host_readings
    workers_cpu = r["workers_cpu_pct"].value
    workers = r["workers"].value or loader.num_workers
    system = r["sys_cpu_pct"].value
    cores = r["cores_saturated"].value
    parts, saturated, machine_busy = [], False, False
    per_worker: float | None = None
    if workers_cpu is not None and loader.num_workers > 0:
        per_worker = workers_cpu / max(1.0, workers)
        saturated |= per_worker >= WORKER_SATURATED_PCT
        parts.append(
            f"the {workers:.0f} workers use {fmt_pct(workers_cpu)} CPU ({fmt_pct(per_worker)} each)"
        )
    if system is not None:
        machine_busy |= system >= SYSTEM_SATURATED_PCT
        parts.append(f"the system CPU is at {fmt_pct(system)}")
    if cores is not None and m.cpus:
        machine_busy |= cores >= m.cpus
    # a busy machine starves the workers only if they are the ones using it
    saturated |= machine_busy and (per_worker is None or per_worker >= WORKER_BUSY_PCT)
    known = workers_cpu is not None or system is not None or cores is not None
    return _Saturation(known, saturated, " and ".join(parts))


def input_bound(f: Facts) -> Diagnosis:
    s, m, sig = f.summary, f.m, f.signal
    assert sig.share is not None
    loader = m.loader
    waiter = "the GPU waits" if sig.kind == "gpu" else "the training loop waits"
    title = f"Input-bound: {waiter} for data {fmt_share(sig.share)} of the time"
    saving, saving_text = f.saving_of_input()
    strong = sig.share >= STRONG_FACTOR * INPUT_BOUND_SHARE
    d = Diagnosis(
        verdict="input-bound",
        title=title,
        confidence=confidence(strong, m.steady, weaker=int(sig.fallback)),
        saving_bound_share=saving,
        saving_text=saving_text,
    )
    if sig.fallback:
        d.secondary.append(
            "GPU input stalls were not measured "
            f"({s.unavailable.get('gpu_stall_share', 'unavailable')}): judged on host data wait, "
            "which can overstate what the GPU lost."
        )
    if loader is None:
        d.cause = CAUSE_UNKNOWN
        return d
    _input_cause(f, d, loader)
    if d.cause in TUNABLE_CAUSES:
        d.advice.append(TUNE_HINT)
    return d


def _lead_with_changes(
    d: Diagnosis, loader: LoaderInfo, changes: list[Change], cpus: int | None, gpu: bool
) -> None:
    """Put the loader changes (if any) first in the advice, and their explanations last."""
    if changes:
        d.advice.insert(0, change_line(changes, loader.driver))
        d.advice.extend(explain_changes(loader, changes, cpus, gpu))


def _input_cause(f: Facts, d: Diagnosis, loader: LoaderInfo) -> None:
    m, gpu = f.m, f.gpu
    cpus = m.cpus
    epochs = _epoch_pattern(m)
    workers = more_workers(loader, cpus, gpu)
    sat = _saturation(m, loader)
    cpu_text = f"the {cpus} CPUs available" if cpus is not None else "the CPUs"
    if epochs is not None:
        first, later = epochs
        d.cause = CAUSE_FIRST_EPOCH
        d.advice.append(
            f"The first epoch waited {fmt_share(first)} of its step time, later epochs only "
            f"{fmt_share(later)}: the first pass reads from slow storage and later ones from the "
            "page cache. Copy the dataset to local disk or memory before training, or cache "
            "decoded samples."
        )
        changes = loader_changes(loader, workers=None, gpu=gpu, prefetch=False)
        _lead_with_changes(d, loader, changes, cpus, gpu)
        d.wont_help.append(
            "More DataLoader workers: the later epochs already keep up with the current ones."
        )
        return
    if workers is not None:
        d.cause = CAUSE_TOO_FEW_WORKERS
        changes = loader_changes(loader, workers=workers, gpu=gpu)
        d.advice.append(change_line(changes, loader.driver))
        d.advice.extend(explain_changes(loader, changes, cpus, gpu))
        if cpus is not None:
            d.wont_help.append(
                f"More than {workers} workers: only {cpus} CPU{'s are' if cpus != 1 else ' is'} "
                "available to this process."
            )
        return
    if sat.known and sat.saturated:
        d.cause = CAUSE_CPU_SATURATED
        d.advice.append(
            f"The input pipeline is CPU-bound: {sat.text}. Make each sample cheaper: store images "
            "pre-resized, cache decoded tensors, or run the augmentations on the GPU "
            "(e.g. torchvision.transforms.v2 on CUDA tensors)."
        )
        changes = loader_changes(loader, workers=None, gpu=gpu, prefetch=False)
        _lead_with_changes(d, loader, changes, cpus, gpu)
        d.wont_help.append(
            f"More workers than {cpu_text}: the workers already saturate them "
            f"(num_workers={loader.num_workers})."
        )
        d.wont_help.append(
            "A larger prefetch_factor: a deeper queue does not make saturated workers faster."
        )
        return
    if gpu and not loader.pin_memory:
        d.cause = CAUSE_PAGEABLE
        changes = loader_changes(loader, workers=None, gpu=gpu)
        d.advice.append(change_line(changes, loader.driver))
        d.advice.extend(explain_changes(loader, changes, cpus, gpu))
        if sat.known:
            d.wont_help.append(f"More CPU: {sat.text}, not saturated.")
        return
    if sat.known:
        d.cause = CAUSE_STORAGE
        # waiting workers use little CPU: more of them than CPUs overlap more reads
        extra = min(MAX_SUGGESTED_WORKERS, 2 * loader.num_workers)
        changes = loader_changes(
            loader, workers=extra if extra > loader.num_workers else None, gpu=gpu
        )
        d.advice.append(
            f"The workers are mostly idle ({sat.text}) yet cannot keep up: they wait on storage. "
            "Waiting workers need little CPU, so more workers than CPUs overlap more reads; "
            "better still, copy the dataset to local disk or memory, or use fewer, larger files."
        )
        d.wont_help.append("A faster CPU: the workers are not CPU-bound.")
    else:
        changes = loader_changes(loader, workers=None, gpu=gpu)
        d.cause = CAUSE_UNKNOWN
        why = f.summary.unavailable.get("workers_cpu_median_pct", "host sampling unavailable")
        d.advice.append(
            f"The loader already has a worker per CPU; whether its workers are CPU- or "
            f"storage-bound is unknown (worker CPU unavailable: {why})."
        )
    _lead_with_changes(d, loader, changes, cpus, gpu)
