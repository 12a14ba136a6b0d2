"""What a DataLoader iterator tells about its loader and its batches, read without touching data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..record import LoaderInfo

#: Datasets whose samples are tensors already in memory (``LoaderInfo.in_memory``)...
IN_MEMORY_DATASETS = frozenset({"TensorDataset"})
#: ...and the datasets that only pick from others, looked through (``random_split`` makes a
#: ``Subset`` of each part), by the attribute that holds the others.
VIEW_DATASETS = {"Subset": "dataset", "ConcatDataset": "datasets"}


def in_memory(dataset: Any) -> bool:
    """``dataset`` is one of :data:`IN_MEMORY_DATASETS`, or views only such datasets."""
    return _all_seen_through(dataset, lambda d: type(d).__name__ in IN_MEMORY_DATASETS)


def made_by(dataset: Any, package: str) -> bool:
    """``dataset`` is of a class of ``package`` (its top module), or views only such datasets
    (skorch's train split is a ``Subset`` of its own ``Dataset``)."""
    return _all_seen_through(dataset, lambda d: type(d).__module__.partition(".")[0] == package)


def _all_seen_through(dataset: Any, test: Callable[[Any], bool], depth: int = 0) -> bool:
    """``test`` holds for ``dataset``, or for every dataset it views (:data:`VIEW_DATASETS`)."""
    if test(dataset):
        return True
    attr = VIEW_DATASETS.get(type(dataset).__name__)
    if attr is None or depth >= 8:
        return False
    inner = getattr(dataset, attr, None)
    views = inner if isinstance(inner, list) else [inner]
    return inner is not None and all(_all_seen_through(d, test, depth + 1) for d in views)


def loader_settings(it: Any, iterated_by: str | None = None) -> LoaderInfo:
    """The loader's settings as its iterator holds them (an iterator keeps no reference to its
    loader); the slot is assigned by the segmenter. A fastai DataLoader's iterators hold its
    stand-in for torch's (:func:`fastai_loader`): its batch size and dataset are read from it.
    A loader over a dataset of Keras' own was made by Keras (:data:`KERAS_DATASETS`); one over
    skorch's own that skorch iterates (``iterated_by``, :func:`driver_of`) was made by skorch
    of the arrays given to ``fit`` ("skorch-arrays"); any other's driver is what iterates it."""
    sampler = getattr(it, "_index_sampler", None)
    dataset = getattr(it, "_dataset", None)
    batch_size = getattr(sampler, "batch_size", None)
    driver = None
    fastai = fastai_loader(dataset)
    if fastai is not None:
        dataset, batch_size, driver = getattr(fastai, "dataset", None), fastai.bs, "fastai"
    try:
        dataset_len: int | None = len(dataset)  # type: ignore[arg-type]
    except Exception:  # (Keras' ArrayDataset: the samples its sampler draws are its length)
        samples = epoch_samples(sampler)
        dataset_len = samples if samples >= 0 else None
    if driver is None and type(dataset).__module__.startswith("keras."):
        driver = KERAS_DATASETS.get(type(dataset).__name__, "keras")  # Keras made it
    elif iterated_by == "skorch" and made_by(dataset, "skorch"):
        driver = "skorch-arrays"  # (its Dataset of the X, y given to fit)
    return LoaderInfo(
        slot=-1,
        num_workers=int(getattr(it, "_num_workers", 0) or 0),
        pin_memory=bool(getattr(it, "_pin_memory", False)),
        prefetch_factor=getattr(it, "_prefetch_factor", None),
        persistent_workers=bool(getattr(it, "_persistent_workers", False)),
        batch_size=batch_size if type(batch_size) is int else None,
        dataset_type=type(dataset).__name__,
        dataset_len=dataset_len,
        iterable=getattr(it, "_dataset_kind", 0) == 1,  # torch's _DatasetKind.Iterable
        dataset_id=id(dataset),
        in_memory=in_memory(dataset),
        driver=driver or iterated_by,
    )


def fastai_loader(dataset: Any) -> Any:
    """The fastai DataLoader that ``dataset`` stands in for, else None: a fastai DataLoader
    hands torch's iterator a ``_FakeLoader`` of its own as loader and dataset alike, whose
    ``d`` is the fastai DataLoader (its ``bs``, its ``dataset``)."""
    cls = type(dataset)
    if cls.__name__ != "_FakeLoader" or not cls.__module__.startswith("fastai."):
        return None
    fastai = getattr(dataset, "d", None)
    return fastai if hasattr(fastai, "bs") else None


#: The loaders Keras makes of what ``model.fit`` is given, by the class of their dataset: of
#: arrays ("keras"), of a ``keras.utils.PyDataset`` or a generator ("keras-pydataset").
KERAS_DATASETS = {"ArrayDataset": "keras", "ConverterIterableDataset": "keras-pydataset"}
#: The packages whose trainers and wrappers iterate a DataLoader for the user, by the name of
#: their top module, and what the advice calls them (``LoaderInfo.driver``).
DRIVERS = {
    "transformers": "transformers",
    "pytorch_lightning": "lightning",
    "lightning": "lightning",
    "accelerate": "accelerate",
    "keras": "keras-fit",  # a DataLoader the user passed to Keras' model.fit
    "skorch": "skorch",
}
#: Frames looked at, from the fetch outwards, for a driver.
DRIVER_FRAMES = 80


def driver_of(frame: Any) -> str | None:
    """What iterates the loader whose fetch ``frame`` belongs to: the outermost frame of a
    package of :data:`DRIVERS` on the stack (transformers' Trainer iterates through accelerate's
    loader, and it is the Trainer the user configures), or None (the user's own loop)."""
    found = None
    for _ in range(DRIVER_FRAMES):
        if frame is None:
            break
        module = frame.f_globals.get("__name__") or ""
        found = DRIVERS.get(module.partition(".")[0], found)
        frame = frame.f_back
    return found


def epoch_samples(batch_sampler: Any) -> int:
    """Samples a ``BatchSampler`` will batch in the epoch it has just started, -1 unknown."""
    try:
        return len(batch_sampler.sampler)
    except Exception:
        return -1


def counted_batch_size(it: Any) -> int:
    """The batch size when a loader's batch sizes are counted instead of read, else 0.

    They are when torch's own ``BatchSampler`` feeds a map-style dataset through the default
    collate: that collate stacks exactly one sample per index, so batch k (from 1) of an epoch
    of n samples holds ``min(batch_size, n - (k - 1) * batch_size)`` samples, n being ``len()``
    of the sampler the ``BatchSampler`` batches (as ``len(loader)`` assumes too). Counting
    costs the fetch three attribute reads of the iterator, where reading the size from the
    batch costs far more with the caches cold after a model's step. A custom collate, a custom
    batch sampler or an iterable dataset can yield other sizes: their batches are read
    (:func:`batch_size_of`). The wrapper (:meth:`.tracer.StepTracer.wrap_next`) makes the same
    decision on every fetch; the segmenter counts (:meth:`traceml_nb.engine.open_steps.IteratorCount.batch`).
    """
    from torch.utils.data import BatchSampler, default_collate

    sampler = getattr(it, "_index_sampler", None)
    if (
        type(sampler) is not BatchSampler
        or getattr(it, "_collate_fn", None) is not default_collate
        or getattr(it, "_dataset_kind", None) != 0  # torch's _DatasetKind.Map
    ):
        return 0
    size = getattr(sampler, "batch_size", None)
    return size if type(size) is int and size > 0 else 0


def batch_shape_of(batch: Any, _depth: int = 0) -> Any:
    """The shape of the first tensor-like in ``batch`` (tensor, tuple/list, mapping), as it is (a
    ``torch.Size``, a tuple), or None: its first dimension is the batch's samples, and its
    elements tell batches padded to their longest sequence apart
    (:func:`~traceml_nb.engine.open_steps.batch_extent`).

    Looks at most two levels deep and at the first four items of a level, so the usual
    ``(inputs, targets)`` and ``{"input_ids": ...}`` batches cost a few attribute reads; the
    shape is read, not converted (the segmenter does that, off the loop's fetch).
    """
    kind = type(batch)
    if (kind is tuple or kind is list) and batch:  # the usual (inputs, targets), read directly
        first = getattr(batch[0], "shape", None)
        if first:  # (a shape of no dimension: the other items may tell)
            return first
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return shape
    if _depth >= 2:
        return None
    if isinstance(batch, (tuple, list)):
        items: Any = batch[:4]
    elif isinstance(batch, Mapping):  # a dict, transformers' BatchEncoding (a UserDict)
        items = list(batch.values())[:4]
    else:
        return None
    for item in items:
        found = batch_shape_of(item, _depth + 1)
        if found:
            return found
    return None
