"""What an input-bound run's cause is (:mod:`traceml_nb.analysis.input_bound` finds it), in
words: the causes, and the sentences of the advice and of what will not help that belong to
one cause (the loader changes themselves are :mod:`.diagnosis_words`')."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..analysis.formatting import fmt_pct, fmt_share, plural
from ..analysis.input_bound import (
    CAUSE_CPU_SATURATED,
    CAUSE_CPU_STARVED,
    CAUSE_FIRST_EPOCH,
    CAUSE_IN_MEMORY,
    CAUSE_KERAS_PYDATASET,
    CAUSE_PAGEABLE,
    CAUSE_STORAGE,
    CAUSE_TOO_FEW_WORKERS,
    CAUSE_UNKNOWN,
)

Facts = dict[str, Any]

#: Each cause of an input-bound run (``Diagnosis.cause``), in words.
CAUSES = {
    CAUSE_TOO_FEW_WORKERS: "too few DataLoader workers",
    CAUSE_CPU_SATURATED: "DataLoader workers CPU-saturated (decode/augmentation bound)",
    CAUSE_CPU_STARVED: "DataLoader workers short of CPU (they wait for one; other threads take it)",
    CAUSE_PAGEABLE: "host-to-device copies from pageable memory",
    CAUSE_FIRST_EPOCH: "slow storage on the first epoch (later epochs read from the cache)",
    CAUSE_STORAGE: "slow storage (the workers are idle, yet cannot keep up)",
    CAUSE_IN_MEMORY: "batches in memory, handed over by worker processes (no storage to wait on)",
    CAUSE_UNKNOWN: "input pipeline too slow (worker CPU unavailable)",
    CAUSE_KERAS_PYDATASET: "a Keras PyDataset that loads too slowly (Keras loads its batches)",
}


def _saturation(f: Facts) -> str:
    """``the 2 workers use 70% CPU (35% each, waiting 35% of the time for a CPU) and the
    system CPU is at 95%`` (the wait where it was measured)."""
    parts = []
    if f.get("workers_cpu_pct") is not None:
        one = round(f["workers"]) == 1
        wait = f.get("per_worker_wait_pct")
        details = [] if one else [f"{fmt_pct(f['per_worker_pct'])} each"]
        if wait is not None:
            details.append(f"waiting {fmt_pct(wait)} of the time for a CPU")
        parts.append(
            f"the {plural(f['workers'], 'worker')} use{'s' if one else ''} "
            f"{fmt_pct(f['workers_cpu_pct'])} CPU" + (f" ({', '.join(details)})" if details else "")
        )
    if f.get("system_cpu_pct") is not None:
        parts.append(f"the system CPU is at {fmt_pct(f['system_cpu_pct'])}")
    return " and ".join(parts)


#: The sentence of each input-bound cause's finding code, from its facts.
INPUT_SENTENCES: dict[str, Callable[[Facts], str]] = {
    "cache-the-dataset": lambda f: (
        f"The first epoch waited {fmt_share(f['first_share'])} of its step time, later epochs "
        f"only {fmt_share(f['later_share'])}: the first pass reads from slow storage and later "
        "ones from the page cache. Copy the dataset to local disk or memory before training, "
        "or cache decoded samples."
    ),
    "cheaper-samples": lambda f: (
        f"The input pipeline is CPU-bound: {_saturation(f)}. Make each sample cheaper: store "
        "images pre-resized, cache decoded tensors, or run the augmentations on the GPU "
        "(e.g. torchvision.transforms.v2 on CUDA tensors)."
    ),
    "fewer-training-threads": lambda f: (
        f"The training process itself uses {fmt_pct(f['proc_cpu_pct'])} CPU (torch's intra-op "
        f"threads) on {f['cpus']} CPUs, and its workers wait for a CPU ({_saturation(f)}). Call "
        f"torch.set_num_threads({f['threads']}) before the loop to leave the workers the CPUs "
        "they need, and keep it if the steps are faster."
    ),
    "workers-short-of-cpu": lambda f: (
        f"The workers wait for a CPU ({_saturation(f)}) that the training process"
        + (f" ({fmt_pct(f['proc_cpu_pct'])} CPU)" if f.get("proc_cpu_pct") is not None else "")
        + " and any other processes take"
        + (f": the {f['cpus']} CPUs cannot run them all" if f.get("cpus") else "")
        + ". Make each sample cheaper (below), stop what else runs on this machine, or run "
        "where the workers have CPUs of their own."
    ),
    "workers-wait-on-storage": lambda f: (
        f"The workers are mostly idle ({_saturation(f)}) yet cannot keep up: they wait on "
        "storage. Waiting workers need little CPU, so more workers than CPUs overlap more "
        "reads; better still, copy the dataset to local disk or memory, or use fewer, larger "
        "files."
    ),
    "keras-pydataset-workers": lambda f: (
        f"Give your keras.utils.PyDataset workers={f['workers']} and use_multiprocessing=True "
        "(its own arguments): Keras loads its batches itself, with one thread by default, and "
        "hands them to a DataLoader of no workers; in processes they load in parallel with the "
        "compute."
    ),
    "in-memory-workers": lambda f: (
        f"The dataset is a {f['dataset_type']}, already in memory: its workers wait on no "
        f"storage ({_saturation(f)}). The loop waits while each batch is handed over from a "
        "worker process, and on few CPUs the workers take CPU from the training process. Try "
        "num_workers=0 with each batch made in one call (slice the tensors, or give the dataset "
        "a __getitems__), and keep whichever is faster."
    ),
    "workers-bound-unknown": lambda f: (
        "The loader already has a worker per CPU; whether its workers are CPU- or "
        f"storage-bound is unknown (worker CPU unavailable: {f['why']})."
    ),
    "more-workers-in-memory": lambda f: (
        "More DataLoader workers: the samples are already in memory; more processes add "
        "hand-overs and take CPU from the training process."
    ),
    "more-workers-later-epochs-keep-up": lambda f: (
        "More DataLoader workers: the later epochs already keep up with the current ones."
    ),
    "more-workers-saturated": lambda f: (
        "More workers than "
        + (f"the {f['cpus']} CPUs available" if f.get("cpus") is not None else "the CPUs")
        + f": the workers already saturate them (num_workers={f['num_workers']})."
    ),
    "more-workers-starved": lambda f: (
        "More DataLoader workers: the workers already wait for a CPU; more would wait too."
    ),
    "larger-prefetch-saturated": lambda f: (
        "A larger prefetch_factor: a deeper queue does not make saturated workers faster."
    ),
    "more-cpu-not-saturated": lambda f: f"More CPU: {_saturation(f)}, not saturated.",
    "faster-cpu-not-cpu-bound": lambda f: "A faster CPU: the workers are not CPU-bound.",
}
