"""Concrete DataLoader changes, read from the user's own loader and the CPUs really available,
as findings the views write in the terms of whatever built the loader (``driver``): the user's
own ``DataLoader(...)``, the transformers ``TrainingArguments``, a Lightning module's
``train_dataloader()``, the loader passed to accelerate's ``Accelerator.prepare``, fastai's
DataLoaders, or what Keras' ``model.fit`` was given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..engine.record import LoaderInfo
from .findings import Finding
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


#: skorch's ``NeuralNet`` takes the training DataLoader's arguments with this prefix (its
#: ``batch_size`` is its own).
SKORCH_ARGUMENTS = {
    name: f"iterator_train__{name}"
    for name in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
}


#: ...and those of the loaders it evaluates and predicts with (validation, ``predict``).
SKORCH_VALID_ARGUMENTS = {
    name: f"iterator_valid__{name}"
    for name in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
}


#: What skorch's ``NeuralNet`` iterates: a loader of the user's dataset, and one of skorch's own
#: ``Dataset`` of the arrays given to ``fit``.
SKORCH_DRIVERS = frozenset({"skorch", "skorch-arrays"})


#: What a DataLoader setting is called where the user sets it, by what built the loader
#: (``LoaderInfo.driver``); a setting not named here is called as ``DataLoader`` calls it.
SETTING_NAMES = {
    "transformers": TRAINING_ARGUMENTS,
    "fastai": {"batch_size": "bs"},
    **dict.fromkeys(SKORCH_DRIVERS, SKORCH_ARGUMENTS),
}
#: ...where a loader does not train (an evaluation's, a prediction's), where that name differs:
#: the Trainer's ``per_device_eval_batch_size``, skorch's ``iterator_valid__`` prefix.
EVALUATION_SETTING_NAMES = {
    **SETTING_NAMES,
    "transformers": {**TRAINING_ARGUMENTS, "batch_size": "per_device_eval_batch_size"},
    **dict.fromkeys(SKORCH_DRIVERS, SKORCH_VALID_ARGUMENTS),
}
#: The DataLoader settings a driver's loaders do not take (fastai's ``DataLoader`` has no
#: ``prefetch_factor``), or take to no effect: neither advised nor shown among the loader's
#: settings.
NOT_TAKEN = {
    "fastai": frozenset({"prefetch_factor"}),
    # skorch builds its DataLoaders anew for each epoch (``NeuralNet.get_iterator``): persistent
    # workers end with their loader, at the epoch's end
    **dict.fromkeys(SKORCH_DRIVERS, frozenset({"persistent_workers"})),
    # Keras hands a PyDataset's batches to a DataLoader of its own, of no workers: its
    # settings are none of the user's (the PyDataset's are not seen)
    "keras-pydataset": frozenset(
        {"num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size"}
    ),
}
#: What Keras' ``model.fit`` iterates: a loader it made of arrays, one it made of a PyDataset or
#: a generator, a DataLoader given to it.
KERAS_DRIVERS = frozenset({"keras", "keras-pydataset", "keras-fit"})
#: What builds loaders that make their batches themselves (fastai's ``create_item`` and
#: collate; Keras' slices of the arrays given to ``model.fit``; skorch's ``Dataset`` of them):
#: a dataset's ``__getitems__`` is not theirs to give.
OWN_BATCHES = frozenset({"fastai", "keras", "keras-pydataset", "skorch-arrays"})
#: What builds loaders that ``%traceml tune`` cannot build afresh (it builds torch DataLoaders
#: over the run's dataset): those that make their batches themselves.
UNTUNABLE_DRIVERS = OWN_BATCHES


def setting_name(setting: str, driver: str | None, trains: bool = True) -> str:
    """What a DataLoader setting is called where the user sets it, for a loader that trains
    or (``trains`` False) one that evaluates or predicts."""
    names = SETTING_NAMES if trains else EVALUATION_SETTING_NAMES
    return names.get(driver or "", {}).get(setting, setting)


def setting_named_in(setting: str, role: Mapping[str, Any]) -> str:
    """What a DataLoader setting is called for the loader whose :func:`role_of` facts
    ``role`` holds (a loader that trains where they do not say)."""
    return setting_name(setting, role.get("driver"), role.get("trains", True))


def takes(driver: str | None, setting: str) -> bool:
    """Whether the loaders that ``driver`` builds take ``setting``."""
    return setting not in NOT_TAKEN.get(driver or "", ())


def loader_settings(loader: LoaderInfo) -> dict[str, Any]:
    """The loader's settings the advice is about, by their DataLoader names (those its driver
    takes)."""
    settings = {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "batch_size": loader.batch_size,
    }
    return {k: v for k, v in settings.items() if takes(loader.driver, k)}


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
    """One DataLoader argument to change: ``num_workers`` 0 → 2, or ``pin_memory`` to True."""

    setting: str
    new: object
    old: object = None  #: shown as ``old → new`` when set

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    ``prefetch_factor`` only when the loader will have workers; none that the loader's driver
    does not take (:data:`NOT_TAKEN`).
    """
    changes = []
    if workers is not None and workers != loader.num_workers:
        changes.append(Change("num_workers", workers, loader.num_workers))
    effective_workers = workers if workers is not None else loader.num_workers
    driver = loader.driver
    if gpu and not loader.pin_memory and takes(driver, "pin_memory"):
        changes.append(Change("pin_memory", True))
    if (
        persistent
        and takes(driver, "persistent_workers")
        and effective_workers > 0
        and not loader.persistent_workers
    ):
        changes.append(Change("persistent_workers", True))
    current = loader.prefetch_factor if loader.num_workers > 0 else None
    if (
        prefetch
        and takes(loader.driver, "prefetch_factor")
        and effective_workers > 0
        and (current or TORCH_DEFAULT_PREFETCH) < SUGGESTED_PREFETCH
    ):
        changes.append(Change("prefetch_factor", SUGGESTED_PREFETCH, current))
    return changes


def change_loader(changes: list[Change], loader: LoaderInfo) -> Finding:
    """The one-line instruction shown first in the advice: these changes, made where the
    loader's driver (``LoaderInfo.driver``) builds it, for a loader that trains or not."""
    facts = {"changes": [c.to_dict() for c in changes], **role_of(loader)}
    return Finding("change-loader", facts)


def role_of(loader: LoaderInfo | None) -> dict[str, Any]:
    """The facts the views name a loader's settings and its place by: what built it
    (``driver``) and whether it trains (``trains``: False for an evaluation's or a
    prediction's loader, whose settings some trainers name apart)."""
    if loader is None:
        return {"driver": None, "trains": True}
    return {"driver": loader.driver, "trains": loader.is_training}


def explain_changes(
    loader: LoaderInfo, changes: list[Change], cpus: int | None, gpu: bool
) -> list[Finding]:
    """Why each change helps, one finding each (``why-num_workers``, ``why-pin_memory``, …),
    with the loader's current workers, its driver, the CPUs and whether a GPU waits; and, where
    more workers are advised for an ``IterableDataset``, what each of them yields
    (``iterable-sharding``)."""
    found = [
        Finding(
            f"why-{change.setting}",
            {
                **change.to_dict(),
                **role_of(loader),
                "num_workers": loader.num_workers,
                "cpus": cpus,
                "gpu": gpu,
            },
        )
        for change in changes
    ]
    more = [c.new for c in changes if c.setting == "num_workers" and c.new != c.old]
    if loader.iterable and more and int(str(more[0])) > 1:
        found.append(Finding(ITERABLE_SHARDING, {"workers": more[0]}))
    return found


#: The note beside more workers for an ``IterableDataset``: each worker iterates a copy of it.
ITERABLE_SHARDING = "iterable-sharding"
