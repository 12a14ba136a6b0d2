"""What a DataLoader iterator tells about its loader and its batches, read without touching data."""

from __future__ import annotations

from typing import Any

from ..record import LoaderInfo


def loader_settings(it: Any) -> LoaderInfo:
    """The loader's settings as its iterator holds them (an iterator keeps no reference to its
    loader); the slot is assigned by the segmenter."""
    sampler = getattr(it, "_index_sampler", None)
    dataset = getattr(it, "_dataset", None)
    try:
        dataset_len: int | None = len(dataset)  # type: ignore[arg-type]
    except Exception:
        dataset_len = None
    return LoaderInfo(
        slot=-1,
        num_workers=int(getattr(it, "_num_workers", 0) or 0),
        pin_memory=bool(getattr(it, "_pin_memory", False)),
        prefetch_factor=getattr(it, "_prefetch_factor", None),
        persistent_workers=bool(getattr(it, "_persistent_workers", False)),
        batch_size=getattr(sampler, "batch_size", None),
        dataset_type=type(dataset).__name__,
        dataset_len=dataset_len,
        iterable=getattr(it, "_dataset_kind", 0) == 1,  # torch's _DatasetKind.Iterable
    )


def batch_size_of(batch: Any, _depth: int = 0) -> int:
    """First dimension of the first tensor-like in ``batch`` (tensor, tuple/list, dict), or -1.

    Looks at most two levels deep and at the first four items of a level, so the usual
    ``(inputs, targets)`` and ``{"input_ids": ...}`` batches cost a few attribute reads.
    """
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else -1
        except Exception:
            return -1
    if _depth >= 2:
        return -1
    if isinstance(batch, (tuple, list)):
        items: Any = batch[:4]
    elif isinstance(batch, dict):
        items = list(batch.values())[:4]
    else:
        return -1
    for item in items:
        n = batch_size_of(item, _depth + 1)
        if n >= 0:
            return n
    return -1
