"""Concrete DataLoader changes, read from the user's own loader and the CPUs really available,
written in the terms of whatever built the loader: the user's own ``DataLoader(...)``, the
transformers ``TrainingArguments``, a Lightning module's ``train_dataloader()``, or the loader
passed to accelerate's ``Accelerator.prepare``."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.record import LoaderInfo
from .thresholds import MAX_SUGGESTED_WORKERS, SUGGESTED_PREFETCH

TORCH_DEFAULT_PREFETCH = 2


#: The ``TrainingArguments`` field of each DataLoader setting (transformers' Trainer builds the
#: loaders from them).
TRAINING_ARGUMENTS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "batch_size": "per_device_train_batch_size",
}
#: Where the change goes, by what iterated the loader (``LoaderInfo.driver``).
WHERE = {
    None: "Change the training DataLoader",
    "transformers": "Change the Trainer's TrainingArguments",
    "lightning": "Change the DataLoader that your LightningModule's (or DataModule's) "
    "train_dataloader() returns",
    "accelerate": "Change the DataLoader you pass to Accelerator.prepare()",
}


def setting_name(setting: str, driver: str | None) -> str:
    """What a DataLoader setting is called where the user sets it."""
    return TRAINING_ARGUMENTS.get(setting, setting) if driver == "transformers" else setting


def describe_loader(loader: LoaderInfo) -> str:
    """The loader's settings as the user would write them."""
    values = {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "batch_size": loader.batch_size,
    }
    return ", ".join(f"{setting_name(k, loader.driver)}={v}" for k, v in values.items())


def worker_target(cpus: int | None, gpu: bool) -> int:
    """How many workers to suggest: one per CPU this process may use, at most
    ``MAX_SUGGESTED_WORKERS``; without a CPU count, 2. With a single CPU and no GPU, a worker
    only competes with the training loop for that CPU, so 0."""
    if cpus is None:
        return 2
    if cpus <= 1 and not gpu:
        return 0
    return max(1, min(cpus, MAX_SUGGESTED_WORKERS))


def more_workers(loader: LoaderInfo, cpus: int | None, gpu: bool) -> int | None:
    """The worker count to suggest, or ``None`` when more workers would not find a free CPU."""
    target = worker_target(cpus, gpu)
    return target if loader.num_workers < target else None


@dataclass(frozen=True)
class Change:
    """One DataLoader argument to change: ``num_workers=0 → num_workers=2`` or ``pin_memory=True``."""

    setting: str
    new: object
    old: object = None  #: shown as ``old → new`` when set

    def __str__(self) -> str:
        return self.text(None)

    def text(self, driver: str | None) -> str:
        """The change in the terms of ``driver`` (``LoaderInfo.driver``)."""
        name = setting_name(self.setting, driver)
        if self.old is None:
            return f"{name}={self.new}"
        return f"{name}={self.old} \u2192 {name}={self.new}"


def loader_changes(
    loader: LoaderInfo,
    *,
    workers: int | None,
    gpu: bool,
    prefetch: bool = True,
    persistent: bool = True,
) -> list[Change]:
    """The settings to change, in the order they are shown.

    ``workers``: new worker count (``None`` keeps it). ``pin_memory`` only when a GPU is in use
    (pinned memory only speeds up host-to-GPU copies); ``persistent_workers`` and
    ``prefetch_factor`` only when the loader will have workers.
    """
    changes = []
    if workers is not None and workers != loader.num_workers:
        changes.append(Change("num_workers", workers, loader.num_workers))
    effective_workers = workers if workers is not None else loader.num_workers
    if gpu and not loader.pin_memory:
        changes.append(Change("pin_memory", True))
    if persistent and effective_workers > 0 and not loader.persistent_workers:
        changes.append(Change("persistent_workers", True))
    current = loader.prefetch_factor if loader.num_workers > 0 else None
    if (
        prefetch
        and effective_workers > 0
        and (current or TORCH_DEFAULT_PREFETCH) < SUGGESTED_PREFETCH
    ):
        changes.append(Change("prefetch_factor", SUGGESTED_PREFETCH, current))
    return changes


def change_line(changes: list[Change], driver: str | None = None) -> str:
    """The one-line instruction shown first in the advice, where the user makes it."""
    where = WHERE.get(driver, WHERE[None])
    return f"{where}: " + ", ".join(c.text(driver) for c in changes)


def explain_changes(
    loader: LoaderInfo, changes: list[Change], cpus: int | None, gpu: bool
) -> list[str]:
    """One sentence per change saying why it helps (in the terms of ``loader.driver``)."""

    def name(setting: str) -> str:
        return setting_name(setting, loader.driver)

    lines = []
    for change in changes:
        if change.setting == "num_workers":
            nw = loader.num_workers
            if nw == 0:
                who = "the main process loads every batch"
            else:
                who = f"{nw} worker{'s' if nw != 1 else ''} cannot keep up"
            waiter = "the GPU" if gpu else "the training loop"
            if cpus is None:
                cpu_text = ""
            elif int(str(change.new)) <= cpus:
                cpu_text = f" (one per CPU available: {cpus})"
            else:
                cpu_text = f" (more than the {cpus} CPUs: workers that wait need little CPU)"
            lines.append(
                f"With {name('num_workers')}={nw}, {who} while {waiter} waits; {change.new} workers"
                f"{cpu_text} load batches in parallel with the compute."
            )
        elif change.setting == "pin_memory":
            lines.append(
                f"{name('pin_memory')}=True puts batches in page-locked memory, so copying them to the GPU "
                "with .to(device, non_blocking=True) overlaps the compute."
            )
        elif change.setting == "persistent_workers":
            lines.append(
                f"{name('persistent_workers')}=True keeps the workers alive between epochs instead of "
                "starting them again (each start costs the first-batch wait again)."
            )
        elif change.setting == "prefetch_factor":
            lines.append(
                f"{name('prefetch_factor')}={change.new} keeps {change.new} batches per worker in flight, "
                "which absorbs slow samples."
            )
    return lines
