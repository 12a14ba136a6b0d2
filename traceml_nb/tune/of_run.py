"""Tuning the training DataLoader of a recorded run: its loader found, its measurements given.

The run is a history entry (``summary``, ``loaders``, ``environment``, ``id``, ``label``): what
it measured (compute per step, step time, data wait) is what the tuner's prediction is built on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..analysis.advice import UNTUNABLE_DRIVERS
from .find import candidate_of, find_loader, namer, training_loader_info
from .recorded_run import RecordedRun
from .tuner import TuneResult, tune

#: What made a loader ``tune`` cannot build afresh (``advice.UNTUNABLE_DRIVERS``), in words.
MADE_BY = {
    "fastai": "a fastai DataLoader",
    "keras": "a DataLoader Keras made of the arrays given to model.fit",
    "keras-pydataset": "a DataLoader Keras made of a PyDataset or generator",
    "skorch-arrays": "a DataLoader skorch made of the arrays given to fit",
}


def tune_run(
    entry: RecordedRun,
    *,
    loader: Any = None,
    namespace: Mapping[str, Any] | None = None,
    **options: Any,
) -> TuneResult:
    """Tune the training DataLoader of run ``entry`` (:func:`~.tuner.tune`; ``options`` as it
    takes them). ``loader``: the DataLoader to tune, else the live one over the run's dataset,
    looked up in ``namespace`` and then among live objects. ``LookupError`` saying why when
    there is no loader to tune."""
    info = training_loader_info(entry.loaders)
    name: str | None = None
    if loader is None and info is not None and info.get("driver") in UNTUNABLE_DRIVERS:
        raise LookupError(
            f"the training loader of run {entry.label} is {MADE_BY[info['driver']]}, which "
            "tune cannot build afresh (it builds torch DataLoaders over a dataset of yours): "
            "follow the report's advice, or pass a torch DataLoader over your dataset: "
            "%traceml tune --loader NAME"
        )
    if loader is None:
        if info is None:
            raise LookupError(f"run {entry.label} iterated no DataLoader: nothing to tune")
        found = find_loader(info, namespace)
        if found is None:
            raise LookupError(
                f"the training DataLoader of run {entry.label} ({info.get('dataset_type')}, "
                f"batch_size={info.get('batch_size')}) is no longer alive; pass it: "
                "%traceml tune --loader NAME"
            )
        loader, name = found
    s = entry.summary
    unavailable = {}
    if s.compute_ms_median is None:
        unavailable["compute_ms"] = s.unavailable.get(
            "step_ms_median", "the run has no steady steps with a DataLoader"
        )
    result = tune(
        loader,
        compute_ms=s.compute_ms_median,
        run_step_ms=s.step_ms_median,
        run_wait_ms=s.data_wait_ms_median,
        gpu=options.pop("gpu", entry.environment.get("device_kind") == "cuda"),
        cpus=options.pop("cpus", s.cpus_available),
        current=candidate_of(info) if info is not None else None,
        name_of=namer(namespace),
        driver=(info or {}).get("driver"),
        trains=int((info or {}).get("optimizer_steps") or 0) > 0,
        run_id=entry.id,
        run_label=entry.label,
        unavailable=unavailable,
        **options,
    )
    result.loader_name = name
    result.cell_entry = entry
    return result
