"""Which loader a run trained on, and where that DataLoader object is now.

A run's record keeps the training loader's settings and the ``id()`` of its dataset, never a
reference (it must not keep the user's data alive). The DataLoader is found again by that id:
first among the notebook's variables, then among the live objects (``gc``), a loader built
inside a function and still held by a trainer included.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from typing import Any

from .candidates import TORCH_DEFAULT_PREFETCH, Candidate


def training_loader_info(loaders: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's training loader (``LoaderInfo.to_dict()`` of each loader seen): the busiest
    of those followed by optimizer steps, else the busiest."""
    if not loaders:
        return None
    training = [d for d in loaders if int(d.get("optimizer_steps") or 0) > 0]
    return max(training or loaders, key=lambda d: int(d.get("fetches") or 0))


def candidate_of(info: dict[str, Any]) -> Candidate:
    """The run's loader settings as a :class:`Candidate`."""
    workers = int(info.get("num_workers") or 0)
    factor = (info.get("prefetch_factor") or TORCH_DEFAULT_PREFETCH) if workers else None
    return Candidate(workers, factor, bool(info.get("pin_memory")))


def _matches(loader: Any, info: dict[str, Any]) -> bool:
    dataset = getattr(loader, "dataset", None)
    if dataset is None or id(dataset) != info.get("dataset_id"):
        return False
    if type(dataset).__name__ != info.get("dataset_type", type(dataset).__name__):
        return False
    size = info.get("batch_size")
    return (
        size is None
        or getattr(loader, "batch_size", size) == size
        or (
            getattr(loader, "batch_sampler", None) is not None
            and getattr(loader.batch_sampler, "batch_size", size) == size
        )
    )


def _settings_score(loader: Any, info: dict[str, Any]) -> int:
    keys = ("num_workers", "pin_memory", "persistent_workers")
    return sum(getattr(loader, k, None) == info.get(k) for k in keys)


def find_loader(
    info: dict[str, Any], namespace: Mapping[str, Any] | None = None
) -> tuple[Any, str | None] | None:
    """The live DataLoader over the run's dataset with its batch size, and its variable name
    (None when found outside ``namespace``); None when there is none any more."""
    from torch.utils.data import DataLoader

    found: list[tuple[Any, str | None]] = []
    for name, value in (namespace or {}).items():
        if not name.startswith("_") and isinstance(value, DataLoader) and _matches(value, info):
            found.append((value, name))
    if not found:
        for obj in gc.get_objects():
            try:  # a dead weakref.proxy raises on any look at it, isinstance() included
                if isinstance(obj, DataLoader) and _matches(obj, info):
                    found.append((obj, None))
            except ReferenceError:
                continue
    if not found:
        return None
    return max(found, key=lambda pair: _settings_score(pair[0], info))


def namer(namespace: Mapping[str, Any] | None) -> Callable[[Any], str | None]:
    """``name_of(obj)``: the notebook variable that holds ``obj`` (None: none)."""
    names: dict[int, str] = {}
    for name, value in (namespace or {}).items():
        if not name.startswith("_"):
            names.setdefault(id(value), name)

    def name_of(obj: Any) -> str | None:
        return names.get(id(obj))

    return name_of
