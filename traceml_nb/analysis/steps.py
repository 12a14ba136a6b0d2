"""Which step rows are the measured steps, and which loaders are phases of their own.

Rules, in order (the first that applies wins):

1. explicit markers (``traceml_nb.step()``): the marker rows;
2. training loaders (optimizer steps followed their batches): their rows, less the truncated
   last step and, when there is exactly one training loader, the steps an eval loop ran
   inside (``FLAG_INTERLEAVED``: their time includes the eval); several training loaders
   consumed together (``zip(a, b)``) count once, as the rows of the most-fetched one;
3. optimizer ``step()`` boundaries;
4. the loader fetched most often.

Loaders that are not measured steps become phases (``Summary.phases``), never mixed in.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from ..record import (
    FLAG_INTERLEAVED,
    FLAG_TRUNCATED,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    LoaderInfo,
    RunRecord,
    StepColumns,
    StepTable,
)
from .model import PhaseSummary


@dataclass
class StepSelection:
    """The measured steps as numpy arrays (times in ms), plus where they came from."""

    source: str  #: "marker", "dataloader", "optimizer" or "none"
    slots: list[int]  #: loader slots whose rows are the steps ([] for markers/optimizer)
    start_s: np.ndarray  #: step start, seconds since the run start
    wall_ms: np.ndarray
    wait_ms: np.ndarray
    batch: np.ndarray  #: -1 where the batch size could not be read
    gpu_stall_ms: np.ndarray  #: NaN while pending or unavailable
    flags: np.ndarray

    def __len__(self) -> int:
        return len(self.wall_ms)


def _np(col: array, dtype: str) -> np.ndarray:
    """A read-only numpy view of an ``array.array`` column (no copy)."""
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


def _training_loaders(loaders: list[LoaderInfo]) -> list[LoaderInfo]:
    return [info for info in loaders if info.is_training]


def _choose(cols: StepColumns, loaders: list[LoaderInfo]) -> tuple[str, list[int], np.ndarray]:
    """(source, loader slots, boolean mask of the chosen rows)."""
    source = _np(cols.source, "u1")
    flags = _np(cols.flags, "u1")
    if np.any(source == SOURCE_MARKER):
        return "marker", [], source == SOURCE_MARKER
    training = _training_loaders(loaders)
    if training:
        slots = [info.slot for info in training]
        complete = (flags & FLAG_TRUNCATED) == 0
        interleaved = (flags & FLAG_INTERLEAVED) != 0
        if len(training) == 1:
            return "dataloader", slots, (source == slots[0]) & complete & ~interleaved
        # Several training loaders: used one after another, each row is a step; consumed
        # together (``zip(a, b)``) their rows overlap, and the primary loader's rows, which
        # carry the whole step's wait, are the steps.
        primary = max(training, key=lambda info: (info.fetches, -info.slot)).slot
        mask = complete & ((source == primary) | (np.isin(source, slots) & ~interleaved))
        return "dataloader", slots, mask
    if np.any(source == SOURCE_OPTIMIZER):
        return "optimizer", [], source == SOURCE_OPTIMIZER
    if loaders:
        busiest = max(loaders, key=lambda info: info.fetches)
        mask = (source == busiest.slot) & ((flags & FLAG_TRUNCATED) == 0)
        return "dataloader", [busiest.slot], mask
    return "none", [], np.zeros(len(source), dtype=bool)


def select_rows(record: RunRecord) -> tuple[StepSelection, StepColumns]:
    """The measured steps of ``record`` as arrays, and the snapshot they were taken from."""
    cols = record.steps.snapshot()
    source, slots, mask = _choose(cols, record.loaders)
    start_ns = _np(cols.start_ns, "i8")[mask]
    sel = StepSelection(
        source=source,
        slots=slots,
        start_s=start_ns / 1e9,
        wall_ms=_np(cols.wall_ns, "i8")[mask] / 1e6,
        wait_ms=_np(cols.wait_ns, "i8")[mask] / 1e6,
        batch=_np(cols.batch, "i4")[mask],
        gpu_stall_ms=_np(cols.gpu_stall_ms, "f4")[mask].astype(np.float64),
        flags=_np(cols.flags, "u1")[mask],
    )
    return sel, cols


def select_steps(record: RunRecord) -> tuple[StepColumns, str]:
    """The rows that are the measured steps (a :class:`StepColumns` copy) and their source:
    ``"marker"``, ``"dataloader"``, ``"optimizer"`` or ``"none"``."""
    cols = record.steps.snapshot()
    source, _, mask = _choose(cols, record.loaders)
    picked = []
    for name, code in zip(StepTable.COLUMNS, StepTable.TYPECODES, strict=True):
        values = _np(getattr(cols, name), np.dtype(code).str)[mask]
        out = array(code)
        out.frombytes(values.tobytes())
        picked.append(out)
    return StepColumns(0, *picked), source


def phases(record: RunRecord, cols: StepColumns, selection: StepSelection) -> list[PhaseSummary]:
    """One phase per loader whose rows are not the measured steps (eval loaders, mostly)."""
    if not record.loaders:
        return []
    source = _np(cols.source, "u1")
    wall = _np(cols.wall_ns, "i8")
    wait = _np(cols.wait_ns, "i8")
    has_training = any(info.is_training for info in record.loaders)
    out = []
    for info in record.loaders:
        if selection.source == "dataloader" and info.slot in selection.slots:
            continue
        if info.is_training and selection.source != "dataloader":
            continue  # its batches are inside the marker/optimizer steps already
        rows = source == info.slot
        n = int(rows.sum())
        if n == 0:
            continue
        total_ns = int(wall[rows].sum())
        share = float(wait[rows].sum()) / total_ns if total_ns > 0 else None
        out.append(
            PhaseSummary(
                name=f"eval (loader {info.slot})" if has_training else f"loader {info.slot}",
                batches=n,
                total_s=total_ns / 1e9,
                data_wait_share=share,
            )
        )
    return out


def training_loader(record: RunRecord, selection: StepSelection) -> LoaderInfo | None:
    """The loader the advice is about: the busiest of the measured (or training) loaders."""
    candidates = [info for info in record.loaders if info.slot in selection.slots]
    if not candidates:
        candidates = _training_loaders(record.loaders) or list(record.loaders)
    if not candidates:
        return None
    return max(candidates, key=lambda info: info.fetches)
