"""``%traceml tune``: the fastest DataLoader settings, found by measuring them.

The tuner builds fresh DataLoaders over the training loader's own dataset, sampler kind, batch
size, ``collate_fn``, ``worker_init_fn``, ``generator`` and ``multiprocessing_context``, with
candidate settings (``num_workers``, ``prefetch_factor``, ``pin_memory``), and iterates each
without the model, the training process kept busy for the run's compute time after each batch
(:mod:`.measure`): the time between batches it measures, with the run's compute time
per step, predicts the step time of each candidate (:mod:`.predict`). The user's loader,
model and optimizer are not touched; every worker process it starts is gone when it ends,
however it ends.

Modules: :mod:`.thresholds` (the named constants), :mod:`.candidates` (the grid, the memory
guard, the line to paste; pure), :mod:`.predict` (measurements, prediction, ranking,
successive halving; pure), :mod:`.measure` (building and iterating the loaders; torch),
:mod:`.tuner` (the rounds, the budget, interrupts). Nothing here is imported by
``import traceml_nb``.
"""

from __future__ import annotations

from typing import Any


def tune(loader: Any, **options: Any) -> Any:
    """Tune ``loader`` (a torch DataLoader) without a run: see :func:`.tuner.tune`."""
    from .tuner import tune as _tune

    return _tune(loader, **options)


__all__ = ["tune"]
