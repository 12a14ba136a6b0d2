"""Which step rows are the run's steps: one rule, :func:`step_rule`, for the live chart and the
report alike.

The rule, in order (the first that applies wins):

1. explicit markers (``traceml_nb.step()``): the marker rows;
2. training loaders (optimizer steps followed their batches): the rows of those that begin
   steps (``LoaderInfo.leads``: the outer loop's loader, not one drawn inside each step, nor
   the second of two loaders consumed with ``zip``). The last step, cut short by the end of
   the run (``break``, ``islice``, an exception) or by the loop leaving its epoch early (the
   loader's next epoch begins), is a step if its optimizer step ran. A step
   an evaluation ran inside (``FLAG_INTERLEAVED``) is a step, which the statistics leave out
   (:mod:`.summary`): its time includes the evaluation. Where the loop fetches each batch
   one step ahead, or a gradient-accumulation cycle's batches before it trains on them
   (``LoaderInfo.fetches_ahead``: a trainer's prefetch), or all of its batches before the
   run's first optimizer step (a list made of the loader's batches, one batch trained on
   over and over), the steps are the optimizer rows instead, which end where each training
   step ends. Optimizer steps made while no training loader's step was open, two or more
   before its next fetch (``FLAG_NO_FETCH``: ``itertools.cycle(loader)`` after its first
   epoch trains on the batches it kept), are steps too; one alone (a step after the epoch's
   last batch, on the gradients its last batches left) is not; and a batch of an epoch begun
   with autograd off (``FLAG_EVALUATING``: an evaluation over the training set) is no step,
   but a phase, as is one of an epoch found an evaluation's once it was over, begun with
   autograd on and the models in eval mode (``LoaderInfo.evaluation_rows``: no optimizer
   step in it, no backward);
3. optimizer ``step()`` boundaries;
4. the loader fetched most often, with the loaders built anew that go on from its epochs
   (``LoaderInfo.follows``: a new DataLoader for each epoch) and their fetches (no optimizer in
   the run: every batch consumed is a step).

Loaders whose rows are not the steps and whose batches are not inside them (evaluation
loaders) become phases of their own (``Summary.phases``), never mixed in.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine.contracts import StepSource
from ..engine.record import (
    FLAG_EPOCH_START,
    FLAG_EVALUATING,
    FLAG_FLOP_COUNTED,
    FLAG_NO_FETCH,
    FLAG_OPTIMIZER_STEP,
    FLAG_PROFILED,
    FLAG_TRUNCATED,
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    LoaderInfo,
    RecordSnapshot,
)
from ..engine.step_table import PhaseRows, StepColumns, StepTable
from .findings import PhaseSummary
from .formatting import fmt_run_span


@dataclass(frozen=True)
class StepRule:
    """Which rows are steps: those whose source is one of ``sources``, that carry none of
    ``excluded_flags`` and, if cut short by the run's end (``FLAG_TRUNCATED``), carry
    ``truncated_if`` (0: such a row is a step anyway)."""

    kind: StepSource
    sources: tuple[int, ...]  #: loader slots, or ``SOURCE_MARKER`` / ``SOURCE_OPTIMIZER``
    #: loaders whose batches are inside the steps (not phases of their own)
    inner: tuple[int, ...] = ()
    excluded_flags: int = 0
    truncated_if: int = 0
    #: and the optimizer rows ``FLAG_NO_FETCH`` marks
    without_fetch: bool = False
    #: ``(slot, first, end)``: that loader's rows ``[first, end)`` of the step table are an
    #: evaluation's, found so after they were written (``LoaderInfo.evaluation_rows``); a
    #: reader that took them for steps reads the rows again when these change
    evaluations: tuple[tuple[int, int, int], ...] = ()
    #: ``(slot, row)``: that loader's row only fetched a batch ahead (``LoaderInfo.ahead_rows``)
    fetched_ahead: tuple[tuple[int, int], ...] = ()

    def mask(self, cols: StepColumns) -> np.ndarray:
        """A boolean per row of ``cols``: is it a step."""
        source = _np(cols.source, "u1")
        flags = _np(cols.flags, "u1")
        keep = np.isin(source, self.sources) & ((flags & self.excluded_flags) == 0)
        if self.truncated_if:
            keep &= ((flags & FLAG_TRUNCATED) == 0) | ((flags & self.truncated_if) != 0)
        if self.without_fetch:
            keep |= (source == SOURCE_OPTIMIZER) & ((flags & FLAG_NO_FETCH) != 0)
        if self.evaluations:
            keep &= ~self.evaluated_later(cols)
        for slot, row in self.fetched_ahead:
            at = row - cols.offset
            if 0 <= at < len(keep) and source[at] == slot:
                keep[at] = False
        return keep

    def evaluated_later(self, cols: StepColumns) -> np.ndarray:
        """A boolean per row of ``cols``: is it in :attr:`evaluations`."""
        source = _np(cols.source, "u1")
        out = np.zeros(len(source), dtype=bool)
        for slot, first, end in self.evaluations:
            lo, hi = max(0, first - cols.offset), max(0, end - cols.offset)
            out[lo:hi] |= source[lo:hi] == slot
        return out


def step_rule(loaders: Sequence[LoaderInfo], markers: int, optimizer_steps: int) -> StepRule:
    """The rule for a run with these loaders and counts (see the module docstring)."""
    if markers > 0:
        return StepRule("marker", (SOURCE_MARKER,))
    training = [info for info in loaders if info.is_training]
    if training:
        leaders = [info for info in training if info.leads > 0] or training
        fetched_before = optimizer_steps > 1 and all(
            0 < info.fetches == info.fetches_before_training for info in leaders
        )
        if fetched_before or any(info.fetches_ahead for info in leaders):
            return StepRule(
                "dataloader", (SOURCE_OPTIMIZER,), tuple(info.slot for info in training)
            )
        return StepRule(
            "dataloader",
            tuple(info.slot for info in leaders),
            tuple(info.slot for info in training),
            excluded_flags=FLAG_EVALUATING,
            truncated_if=FLAG_OPTIMIZER_STEP,
            without_fetch=True,
            evaluations=tuple(
                (info.slot, first, end) for info in leaders for first, end in info.evaluation_rows
            ),
            fetched_ahead=tuple((info.slot, row) for info in leaders for row in info.ahead_rows),
        )
    if optimizer_steps > 0:
        return StepRule("optimizer", (SOURCE_OPTIMIZER,))
    if loaders:
        busiest = _busiest_chain(loaders)
        return StepRule("dataloader", busiest, busiest)
    return StepRule("none", ())


def _busiest_chain(loaders: Sequence[LoaderInfo]) -> tuple[int, ...]:
    """The slots of the loaders fetched most often together, each loader with those whose
    epochs it goes on from (``LoaderInfo.follows``: a new DataLoader for each epoch)."""
    root: dict[int, int] = {}
    fetches: dict[int, int] = {}
    for info in sorted(loaders, key=lambda info: info.slot):
        first = root.get(info.follows, info.slot) if info.follows is not None else info.slot
        root[info.slot] = first
        fetches[first] = fetches.get(first, 0) + info.fetches
    busiest = max(fetches, key=lambda slot: fetches[slot])
    return tuple(slot for slot, first in root.items() if first == busiest)


def rule_of(snapshot: RecordSnapshot) -> StepRule:
    """:func:`step_rule` for a record snapshot."""
    return step_rule(snapshot.loaders, snapshot.markers, snapshot.optimizer_steps)


@dataclass
class StepSelection:
    """The steps as numpy arrays (times in ms), plus the rule that picked them."""

    rule: StepRule
    start_s: np.ndarray  #: step start, seconds since the run start
    wall_ms: np.ndarray
    wait_ms: np.ndarray
    batch: np.ndarray  #: -1 where the batch size could not be read
    gpu_stall_ms: np.ndarray  #: NaN while pending or unavailable
    flags: np.ndarray
    #: the elements of each batch's first tensor, -1 where not read (``StepTable``)
    elements: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: GPU time from the batch's arrival to the next fetch, NaN while pending or unavailable
    gpu_span_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: the input copy, forward, backward and optimizer time (the record's ``PHASE_COLUMNS``),
    #: ms, of the steps that have them (positions in the selection)
    phase_ms: PhaseRows = field(default_factory=PhaseRows.none)
    #: the same phases on the GPU timeline (``GPU_PHASE_COLUMNS``), ms
    gpu_phase_ms: PhaseRows = field(default_factory=PhaseRows.none)

    @property
    def source(self) -> StepSource:
        return self.rule.kind

    def __len__(self) -> int:
        return len(self.wall_ms)


def _np(col: array, dtype: str) -> np.ndarray:
    """A read-only numpy view of an ``array.array`` column (no copy)."""
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


def _began_inside(start_ns: np.ndarray, window_ns: tuple[int, int]) -> np.ndarray:
    # The FLOP count opens at an optimizer step's end, so the step it covers begins inside it
    # (a loader's fetch, a marker, or that optimizer step, logged after the count opened); the
    # step before it only ends inside, however long its end took on a busy machine.
    begin, end = window_ns
    return (start_ns >= begin) & (start_ns < end)


def began_inside(sel: StepSelection, window_ns: tuple[int, int]) -> np.ndarray:
    """Which steps of ``sel`` began inside the FLOP count's window (ns from the run start)."""
    return _began_inside(np.rint(sel.start_s * 1e9), window_ns)


def select_rows(snapshot: RecordSnapshot) -> StepSelection:
    """The steps of ``snapshot`` as arrays; the steps that overlap the profiler's window
    (``RecordSnapshot.profile``) carry ``FLAG_PROFILED``, those that began inside the FLOP
    count's (``RecordSnapshot.flops``; a count made again, each one's) ``FLAG_FLOP_COUNTED``."""
    cols = snapshot.steps
    rule = rule_of(snapshot)
    mask = rule.mask(cols)
    positions = np.flatnonzero(mask)
    start_ns = _np(cols.start_ns, "i8")[mask]
    wall_ns = _np(cols.wall_ns, "i8")[mask]
    flags = _np(cols.flags, "u1")[mask]
    window = snapshot.profile.window_ns if snapshot.profile is not None else None
    if window is not None:
        begin, end = window
        profiled = (start_ns < end) & (start_ns + wall_ns > begin)
        flags = flags | np.where(profiled, FLAG_PROFILED, 0).astype("u1")
    count = snapshot.flops
    windows = [] if count is None else [*count.earlier_windows_ns, count.window_ns]
    for counted in windows:
        if counted is not None:
            inside = _began_inside(start_ns, counted)
            flags = flags | np.where(inside, FLAG_FLOP_COUNTED, 0).astype("u1")
    return StepSelection(
        rule=rule,
        start_s=start_ns / 1e9,
        wall_ms=wall_ns / 1e6,
        wait_ms=_np(cols.wait_ns, "i8")[mask] / 1e6,
        batch=_np(cols.batch, "i4")[mask],
        elements=_np(cols.elements, "i8")[mask],
        gpu_stall_ms=_np(cols.gpu_stall_ms, "f4")[mask].astype(np.float64),
        flags=flags,
        gpu_span_ms=_np(cols.gpu_span_ms, "f4")[mask].astype(np.float64),
        phase_ms=_in_ms(cols.phases.take(positions)),
        gpu_phase_ms=cols.gpu_phases.take(positions),
    )


def _in_ms(phases: PhaseRows) -> PhaseRows:
    return PhaseRows(phases.index, phases.values / 1e6)


def select_steps(snapshot: RecordSnapshot) -> tuple[StepColumns, StepSource]:
    """The rows that are the steps (a :class:`StepColumns` copy) and where they come from."""
    cols = snapshot.steps
    rule = rule_of(snapshot)
    mask = rule.mask(cols)
    picked: dict[str, Any] = {}
    for name, code in zip(StepTable.COLUMNS, StepTable.TYPECODES, strict=True):
        values = _np(getattr(cols, name), np.dtype(code).str)[mask]
        picked[name] = array(code)
        picked[name].frombytes(values.tobytes())
    positions = np.flatnonzero(mask)
    return StepColumns(
        0,
        **picked,
        phases=cols.phases.take(positions),
        gpu_phases=cols.gpu_phases.take(positions),
    ), rule.kind


def phase_loaders(snapshot: RecordSnapshot, selection: StepSelection) -> dict[int, str]:
    """The loaders that are phases of their own (neither the steps nor inside them), by slot,
    with the name of their phase: the loaders over one dataset (a trainer builds its
    evaluation loader anew for each evaluation), or each going on from the one before
    (``LoaderInfo.follows``: Keras builds its validation loader anew, of a new dataset, for
    each pass), are one phase."""
    rule = selection.rule
    has_training = snapshot.optimizer_steps > 0 or any(
        info.is_training for info in snapshot.loaders
    )
    groups: dict[int, list[int]] = {}
    key_of: dict[int, int] = {}  #: each loader's group, by slot
    for info in snapshot.loaders:
        key = info.dataset_id or -1 - info.slot  # an unknown dataset: a phase of its own
        if info.follows is not None:  # built anew for each pass (Keras' validation loaders)
            key = key_of.get(info.follows, key)
        key_of[info.slot] = key
        if rule.kind == "dataloader" and info.slot in rule.inner + rule.sources:
            continue
        if info.is_training and rule.kind != "dataloader":
            continue  # its batches are inside the marker/optimizer steps already
        groups.setdefault(key, []).append(info.slot)
    out: dict[int, str] = {}
    for slots in groups.values():
        which = f"loader {slots[0]}" if len(slots) == 1 else f"loaders {_slots_text(slots)}"
        name = f"eval ({which})" if has_training else which
        out.update(dict.fromkeys(slots, name))
    return out


def _slots_text(slots: list[int]) -> str:
    """``1–4`` for consecutive slots, ``1, 3, 7`` or ``1–3, 5`` otherwise."""
    return fmt_run_span([("", slot) for slot in slots])


def phase_rows(snapshot: RecordSnapshot, selection: StepSelection) -> dict[str, np.ndarray]:
    """Each phase's name and its rows (a boolean per row of ``snapshot.steps``): the loaders
    that are phases of their own (:func:`phase_loaders`), and the batches of a loader whose
    rows are the steps, in an epoch begun with autograd off (``FLAG_EVALUATING``: an
    evaluation over the training set, ``eval (loader 0)``) or found an evaluation's once it
    was over (``StepRule.evaluations``)."""
    cols = snapshot.steps
    source = _np(cols.source, "u1")
    out: dict[str, np.ndarray] = {}
    for slot, name in phase_loaders(snapshot, selection).items():
        rows = source == slot
        out[name] = out[name] | rows if name in out else rows
    rule = selection.rule
    if rule.kind == "dataloader" and rule.excluded_flags & FLAG_EVALUATING:
        evaluating = (_np(cols.flags, "u1") & FLAG_EVALUATING) != 0
        if rule.evaluations:
            evaluating |= rule.evaluated_later(cols)
        for slot in rule.sources:
            rows = evaluating & (source == slot)
            if rows.any():
                out[f"eval (loader {slot})"] = rows
    return out


def phases(snapshot: RecordSnapshot, selection: StepSelection) -> list[PhaseSummary]:
    """One phase per dataset of the loaders that are neither the steps nor inside them (the
    evaluation, mostly), and one for the evaluations over the training set (:func:`phase_rows`):
    its batches, the time away from training it took (``LoaderInfo.phase_ns``; the sum of its
    steps where that is not known, or where the loader also trains) and its data wait, with
    the part before the run's first optimizer step apart."""
    named = phase_rows(snapshot, selection)
    if not named:
        return []
    cols = snapshot.steps
    source = _np(cols.source, "u1")
    wall = _np(cols.wall_ns, "i8")
    wait = _np(cols.wait_ns, "i8")
    pass_starts = (_np(cols.flags, "u1") & FLAG_EPOCH_START) != 0
    infos = {info.slot: info for info in snapshot.loaders}
    out = []
    for name, rows in named.items():
        batches = int(rows.sum())
        if batches == 0:
            continue
        slots = [int(slot) for slot in np.unique(source[rows])]
        group = [infos[slot] for slot in slots]
        trains = any(info.is_training for info in group)  # (its evaluations over its own set)
        away_ns = 0 if trains else sum(info.phase_ns for info in group)
        total_ns = away_ns if away_ns > 0 else int(wall[rows].sum())
        share = min(1.0, float(wait[rows].sum()) / total_ns) if total_ns > 0 else None
        before = 0 if trains else sum(info.fetches_before_training for info in group)
        passes = int((rows & pass_starts).sum()) if trains else sum(x.epochs for x in group)
        out.append(
            PhaseSummary(
                name,
                batches,
                total_ns / 1e9,
                share,
                slot=slots[0],
                before_training_batches=before,
                before_training_s=sum(info.phase_before_training_ns for info in group) / 1e9,
                passes=passes,
                workers=max(info.num_workers for info in group),
                persistent_workers=all(info.persistent_workers for info in group),
                pass_start_wait_s=float(wait[rows & pass_starts].sum()) / 1e9,
                driver=group[0].driver,
                loaders=len(group),
                trains=trains,
            )
        )
    return out


def training_loader(snapshot: RecordSnapshot, selection: StepSelection) -> LoaderInfo | None:
    """The loader the advice is about: the busiest of those whose rows are the steps, or whose
    batches are inside them (or of the training loaders, or of all)."""
    loaders = snapshot.loaders
    rule = selection.rule
    candidates = [info for info in loaders if info.slot in rule.sources + rule.inner]
    if not candidates:
        candidates = [info for info in loaders if info.is_training] or list(loaders)
    if not candidates:
        return None
    return max(candidates, key=lambda info: info.fetches)
