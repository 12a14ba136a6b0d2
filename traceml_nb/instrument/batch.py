"""Reading the batch size from a batch without touching its data."""

from __future__ import annotations

from typing import Any


def batch_size_of(batch: Any, _depth: int = 0) -> int:
    """First dimension of the first tensor-like in ``batch`` (tensor, tuple/list, dict), or -1.

    Looks at most two levels deep and at the first few items, so the cost stays below a
    microsecond for the usual ``(inputs, targets)`` and ``{"input_ids": ...}`` batches.
    """
    kind = type(batch)
    if kind is tuple or kind is list:  # the usual (inputs, targets): ~0.17 us instead of ~0.3
        first = getattr(batch[0], "shape", None) if batch else None
        if first is not None:
            try:
                if len(first):
                    return int(first[0])
            except Exception:
                pass  # the general path below gives this item's answer (-1) and goes on
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
