"""The input-bound verdict: the steps wait for their batches. Its cause, from the first epoch's
waits, the workers' and the machine's CPU and the loader's settings (too few workers, workers
saturated by decoding, workers short of CPU, pageable copies, slow storage, batches in memory
handed over by workers), and the changes to the user's own loader that address it
(:mod:`.advice`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.record import LoaderInfo
from .advice import (
    UNTUNABLE_DRIVERS,
    Change,
    change_loader,
    explain_changes,
    loader_changes,
    more_workers,
    role_of,
    takes,
    worker_target,
)
from .diagnosis_facts import Facts, confidence
from .findings import Diagnosis, Finding
from .summary import Measurements
from .thresholds import (
    FIRST_EPOCH_FACTOR,
    INPUT_BOUND_SHARE,
    MAX_SUGGESTED_WORKERS,
    STRONG_FACTOR,
    SYSTEM_SATURATED_PCT,
    TRAINING_CORES_PCT,
    WORKER_BUSY_PCT,
    WORKER_SATURATED_PCT,
    WORKER_STARVED_PCT,
)

#: The causes of an input-bound run (``Diagnosis.cause``; the views say them in words).
CAUSE_TOO_FEW_WORKERS = "too-few-workers"
CAUSE_CPU_SATURATED = "workers-cpu-saturated"  #: decode/augmentation bound
CAUSE_CPU_STARVED = "workers-cpu-starved"  #: the workers wait for a CPU others take
CAUSE_PAGEABLE = "pageable-copies"  #: host-to-device copies from pageable memory
CAUSE_FIRST_EPOCH = "first-epoch-storage"  #: later epochs read from the page cache
CAUSE_STORAGE = "slow-storage"  #: the workers are idle, yet cannot keep up
CAUSE_IN_MEMORY = "in-memory-handover"  #: idle workers of a dataset in memory: no storage
CAUSE_UNKNOWN = "input-unknown"  #: worker CPU unavailable
#: a Keras ``PyDataset`` (or generator): Keras loads its batches, in threads or processes of its
#: own, and hands them to a DataLoader of no workers; how many it loads with is not seen
CAUSE_KERAS_PYDATASET = "keras-pydataset"
#: The last line of the advice of an input-bound run whose DataLoader settings are the cause
#: (or may be): run ``%traceml tune``, which measures the settings instead of reading them
#: from rules.
TUNE_HINT = "tune-hint"
#: The causes whose advice ends with ``TUNE_HINT`` (not workers short of CPU: ``tune``
#: iterates the loaders without the model, whose threads are what the workers wait for), for
#: a loader that ``tune`` can build (not one of ``advice.UNTUNABLE_DRIVERS``).
TUNABLE_CAUSES = (
    CAUSE_TOO_FEW_WORKERS, CAUSE_PAGEABLE, CAUSE_STORAGE, CAUSE_IN_MEMORY, CAUSE_UNKNOWN
)  # fmt: skip


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
    starved: bool  #: ...by others: the workers wait for a CPU (``WORKER_STARVED_PCT``)
    #: what the readings say, for the advice: ``workers``, ``workers_cpu_pct`` and
    #: ``per_worker_pct`` (None without workers' readings), ``per_worker_wait_pct`` (None:
    #: not measured), ``system_cpu_pct`` (None: unread)
    facts: dict[str, float | None]


def _saturation(m: Measurements, loader: LoaderInfo) -> _Saturation:
    r = m.host_readings
    workers_cpu = r["workers_cpu_pct"].value
    workers = r["workers"].value or loader.num_workers
    waiting = r["workers_cpu_wait_pct"].value
    system = r["sys_cpu_pct"].value
    cores = r["cores_saturated"].value
    saturated, machine_busy = False, False
    per_worker: float | None = None
    per_wait = 0.0
    facts: dict[str, float | None] = {
        "workers": None, "workers_cpu_pct": None, "per_worker_pct": None,
        "per_worker_wait_pct": None, "system_cpu_pct": system,
    }  # fmt: skip
    if workers_cpu is not None and loader.num_workers > 0:
        per_worker = workers_cpu / max(1.0, workers)
        saturated |= per_worker >= WORKER_SATURATED_PCT
        facts.update(workers=workers, workers_cpu_pct=workers_cpu, per_worker_pct=per_worker)
        if waiting is not None:
            per_wait = waiting / max(1.0, workers)
            facts["per_worker_wait_pct"] = per_wait
    if system is not None:
        machine_busy |= system >= SYSTEM_SATURATED_PCT
    if cores is not None and m.cpus:
        machine_busy |= cores >= m.cpus
    # workers that wait for a CPU are short of one, however busy the machine reads on average;
    # a busy machine starves the workers only if they are the ones using it, or would be given
    # the CPU they wait for; a worker waiting on storage does neither
    starved = per_worker is not None and per_wait >= WORKER_STARVED_PCT
    wanted = None if per_worker is None else per_worker + per_wait
    saturated |= starved or (machine_busy and (wanted is None or wanted >= WORKER_BUSY_PCT))
    known = workers_cpu is not None or system is not None or cores is not None
    return _Saturation(known, saturated, starved, facts)


def input_bound(f: Facts) -> Diagnosis:
    s, m, sig = f.summary, f.m, f.signal
    assert sig.share is not None
    loader = m.loader
    facts = {"input_kind": sig.kind, "input_share": sig.share, **role_of(loader)}
    title = Finding("input-bound", facts)
    saving, saving_finding = f.saving_of_input()
    strong = sig.share >= STRONG_FACTOR * INPUT_BOUND_SHARE
    d = Diagnosis(
        verdict="input-bound",
        title=title,
        confidence=confidence(strong, m.steady, weaker=int(sig.fallback)),
        saving_bound_share=saving,
        saving=saving_finding,
    )
    if sig.fallback:
        why = s.unavailable.get("gpu_stall_share", "unavailable")
        d.secondary.append(Finding("judged-on-host-wait", {"why": why}))
    if loader is None:
        d.cause = CAUSE_UNKNOWN
        return d
    _input_cause(f, d, loader)
    if d.cause in TUNABLE_CAUSES and loader.driver not in UNTUNABLE_DRIVERS:
        d.advice.append(Finding(TUNE_HINT))
    return d


def _lead_with_changes(
    d: Diagnosis, loader: LoaderInfo, changes: list[Change], cpus: int | None, gpu: bool
) -> None:
    """Put the loader changes (if any) first in the advice, and their explanations last."""
    if changes:
        d.advice.insert(0, change_loader(changes, loader))
        d.advice.extend(explain_changes(loader, changes, cpus, gpu))


def _input_cause(f: Facts, d: Diagnosis, loader: LoaderInfo) -> None:
    m, gpu = f.m, f.gpu
    cpus = m.cpus
    if loader.driver == "keras-pydataset":
        d.cause = CAUSE_KERAS_PYDATASET
        target = worker_target(cpus, gpu)
        if target:
            d.advice.append(Finding("keras-pydataset-workers", {"workers": target}))
        return
    in_memory = f.in_memory
    epochs = None if in_memory else _epoch_pattern(m)
    workers = more_workers(loader, cpus, gpu)
    sat = _saturation(m, loader)
    if epochs is not None:
        first, later = epochs
        d.cause = CAUSE_FIRST_EPOCH
        d.advice.append(Finding("cache-the-dataset", {"first_share": first, "later_share": later}))
        changes = loader_changes(loader, workers=None, gpu=gpu, prefetch=False)
        _lead_with_changes(d, loader, changes, cpus, gpu)
        d.wont_help.append(Finding("more-workers-later-epochs-keep-up"))
        return
    if sat.starved and not in_memory:  # no CPU is free for more workers; in memory: below
        _cpu_starved(f, d, loader, sat)
        return
    # idle workers of a dataset in memory wait on no storage: more would hand over as slowly
    idle_in_memory = in_memory and loader.num_workers > 0 and sat.known and not sat.saturated
    if workers is not None and not idle_in_memory:
        d.cause = CAUSE_TOO_FEW_WORKERS
        changes = loader_changes(loader, workers=workers, gpu=gpu)
        d.advice.append(change_loader(changes, loader))
        d.advice.extend(explain_changes(loader, changes, cpus, gpu))
        # only workers measured busy make the loading the CPUs' work: with none (the main
        # process loads, its CPU the compute's too) or idle ones, it may wait on storage, which
        # more workers than CPUs overlap (tune measures it)
        busy = sat.facts["per_worker_pct"]
        if cpus is not None and busy is not None and busy >= WORKER_BUSY_PCT:
            d.wont_help.append(
                Finding("more-workers-than-cpus", {"workers": workers, "cpus": cpus})
            )
        return
    if sat.known and sat.saturated and not sat.starved:
        d.cause = CAUSE_CPU_SATURATED
        d.advice.append(Finding("cheaper-samples", sat.facts))
        changes = loader_changes(loader, workers=None, gpu=gpu, prefetch=False)
        _lead_with_changes(d, loader, changes, cpus, gpu)
        d.wont_help.append(
            Finding("more-workers-saturated", {"cpus": cpus, "num_workers": loader.num_workers})
        )
        if takes(loader.driver, "prefetch_factor"):
            d.wont_help.append(Finding("larger-prefetch-saturated"))
        return
    if gpu and not loader.pin_memory:
        d.cause = CAUSE_PAGEABLE
        changes = loader_changes(loader, workers=None, gpu=gpu)
        d.advice.append(change_loader(changes, loader))
        d.advice.extend(explain_changes(loader, changes, cpus, gpu))
        if sat.known:
            d.wont_help.append(Finding("more-cpu-not-saturated", sat.facts))
        return
    if sat.known and in_memory:
        d.cause = CAUSE_IN_MEMORY  # what to set is measured, not told: see the facts above
        d.advice.append(
            Finding("in-memory-workers", {**sat.facts, "dataset_type": loader.dataset_type})
        )
        d.wont_help.append(Finding("more-workers-in-memory"))
        return
    if sat.known:
        d.cause = CAUSE_STORAGE
        # waiting workers use little CPU: more of them than CPUs overlap more reads
        extra = min(MAX_SUGGESTED_WORKERS, 2 * loader.num_workers)
        changes = loader_changes(
            loader, workers=extra if extra > loader.num_workers else None, gpu=gpu
        )
        d.advice.append(Finding("workers-wait-on-storage", sat.facts))
        d.wont_help.append(Finding("faster-cpu-not-cpu-bound"))
    else:
        changes = loader_changes(loader, workers=None, gpu=gpu)
        d.cause = CAUSE_UNKNOWN
        why = f.summary.unavailable.get("workers_cpu_median_pct", "host sampling unavailable")
        d.advice.append(Finding("workers-bound-unknown", {"why": why}))
    _lead_with_changes(d, loader, changes, cpus, gpu)


def _cpu_starved(f: Facts, d: Diagnosis, loader: LoaderInfo, sat: _Saturation) -> None:
    """The workers wait for a CPU: the training process's threads (where it uses more cores
    than the workers leave it) or other processes take them."""
    m, cpus = f.m, f.m.cpus
    d.cause = CAUSE_CPU_STARVED
    training = m.host_readings["proc_cpu_pct"].value
    facts = {"proc_cpu_pct": training, "cpus": cpus, **sat.facts}
    if (
        training is not None
        and cpus is not None
        and training >= TRAINING_CORES_PCT
        and training / 100 > cpus - loader.num_workers
    ):
        threads = max(1, cpus - loader.num_workers)
        d.advice.append(Finding("fewer-training-threads", {**facts, "threads": threads}))
    else:
        d.advice.append(Finding("workers-short-of-cpu", facts))
    d.advice.append(Finding("cheaper-samples", sat.facts))
    d.wont_help.append(Finding("more-workers-starved", sat.facts))
    if takes(loader.driver, "prefetch_factor"):
        d.wont_help.append(Finding("larger-prefetch-saturated"))
