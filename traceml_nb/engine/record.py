"""The run record: columnar, bounded tables that the instruments write and every reader reads.

Writers (the training thread for steps, the sampler thread for samples) only append rows or
fill in a value that was pending. Readers (the live view thread, the analysis at the end) take
a :meth:`snapshot`, which copies the rows present at that moment; under the GIL a slice of an
``array.array`` is atomic, so a reader never blocks the writer and never sees half a row.

Missing values are ``NaN`` inside the tables and ``None`` in everything handed to users.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .optimizer_info import OptimizerInfo
from .profile_capture import ProfileCapture
from .step_table import StepColumns, StepTable

if TYPE_CHECKING:
    from .flop_capture import FlopCount

NAN = float("nan")

# --- step sources: who closed the step -------------------------------------------------------
#: Loader slots are 0..MAX_LOADERS-1; the special sources below mark the other step kinds.
MAX_LOADERS = 250
SOURCE_MARKER = 253  #: explicit ``traceml_nb.step()`` / ``run.step()`` markers
SOURCE_OPTIMIZER = 254  #: ``optimizer.step()`` boundaries (used when no DataLoader is seen)

# --- step flags (bit field) -------------------------------------------------------------------
FLAG_EPOCH_START = 1  #: first batch of an epoch (its wait includes worker start-up)
#: a loader whose batches no optimizer step followed (an evaluation) was iterated inside this step
FLAG_INTERLEAVED = 2
#: closed by the end of the run, or by the loader's next epoch where the loop left its
#: iterator (a ``break``), not by the iterator's next batch
FLAG_TRUNCATED = 4
FLAG_OPTIMIZER_STEP = 8  #: at least one ``optimizer.step()`` ran inside this step
#: the step ran (in part) under ``torch.profiler`` (``RunRecord.profile``); set by the
#: analysis when it selects the steps, not written into the table
FLAG_PROFILED = 16
#: the step's FLOPs were being counted (``RunRecord.flops``), which slows it: left out of the
#: statistics; set by the analysis, as FLAG_PROFILED is
FLAG_FLOP_COUNTED = 32
#: an optimizer step's row, one of two or more made while no training loader's step was open
#: (before its next fetch): the loop trained on batches it kept (``itertools.cycle(loader)``
#: after its first epoch, a list of the loader's batches)
FLAG_NO_FETCH = 64
#: a batch of an epoch that began with autograd off (under ``torch.no_grad()``): an
#: evaluation's, over the training set too (``evaluate(model, train_loader)``), never a
#: training step (where nothing trains, as in an inference loop, its batches are the steps)
FLAG_EVALUATING = 128


class SampleTable:
    """A time series of periodic samples with named float columns (``NaN`` = unavailable).

    Bounded: past ``cap`` rows every other row is dropped and from then on only every second
    sample is kept, so a run of any length holds at most ``cap`` rows, evenly spread.
    """

    def __init__(self, columns: Iterable[str], cap: int = 20_000) -> None:
        self.names: tuple[str, ...] = ("t",) + tuple(columns)
        self.cap = cap
        self.stride = 1
        self._seen = 0
        self._cols: dict[str, array] = {name: array("d") for name in self.names}

    def append(self, t: float, values: dict[str, float | int | None]) -> None:
        """Add a sample taken ``t`` seconds after the run start; missing keys are unavailable."""
        self._seen += 1
        if (self._seen - 1) % self.stride:
            return
        if len(self) >= self.cap:
            self._decimate()
        cols = self._cols
        for name in self.names[1:]:
            v = values.get(name)
            cols[name].append(NAN if v is None else float(v))
        cols["t"].append(t)  # last: the row is complete once ``t`` has it

    def _decimate(self) -> None:
        for name, col in list(self._cols.items()):
            self._cols[name] = col[::2]
        self.stride *= 2

    def __len__(self) -> int:
        return len(self._cols["t"])

    @property
    def nbytes(self) -> int:
        return sum(c.buffer_info()[1] * c.itemsize for c in self._cols.values())

    def snapshot(self, start: int = 0) -> dict[str, array]:
        """Copy of the rows ``start..`` per column; safe to call from any thread."""
        cols = self._cols
        n = len(cols["t"])
        return {name: cols[name][start:n] for name in self.names}

    def column(self, name: str) -> list[float | None]:
        """One column as a list with ``None`` where the value was unavailable."""
        return [None if math.isnan(v) else v for v in self.snapshot()[name]]


@dataclass
class LoaderInfo:
    """One DataLoader seen in the run: its settings (for the advice) and what the loop did with it.

    A loader is told apart from another by its batch sampler (a DataLoader keeps the same one
    from epoch to epoch, while it makes a new iterator each epoch).
    """

    slot: int
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    batch_size: int | None
    dataset_type: str
    dataset_len: int | None
    iterable: bool
    #: ``id()`` of its dataset: loaders built anew over one dataset (a trainer's evaluation
    #: loader, made for each evaluation) are one phase
    dataset_id: int = 0
    fetches: int = 0
    epochs: int = 0
    #: optimizer steps that ran inside this loader's steps (its batches were followed by them)
    optimizer_steps: int = 0
    #: steps this loader's fetch began: the first fetch of the run or the first after an
    #: optimizer step. A loader drawn inside another's steps (an inner draw) leads none.
    leads: int = 0
    #: closed steps with an optimizer step inside, and those without one told apart by their
    #: phases where the instruments timed them (a forward or a backward ran: work), else by
    #: their time outside ``next()`` against the least of the next
    #: ``open_steps.STEPS_TO_TELL_ROWS`` steps' with one: rows of work (``rows_without_step``:
    #: gradient accumulation, an optimizer step that GradScaler skipped) and rows that did next
    #: to nothing but their fetch (at most ``open_steps.FETCH_ONLY_SHARE`` of it): an epoch's
    #: first (a trainer's prefetch of one batch) or any other (``fetch_only_rows``: a trainer
    #: that fetches all the batches of a gradient-accumulation cycle before it trains on them,
    #: as transformers' Trainer does)
    rows_with_step: int = 0
    rows_without_step: int = 0
    epoch_first_rows_without_step: int = 0
    fetch_only_rows: int = 0
    #: closed steps without an optimizer step not told apart yet
    rows_untold: int = 0
    #: the rows of this loader (``[first, end)`` row indices of the step table) of each epoch
    #: found, once it was over, to be an evaluation over the training set begun with autograd
    #: on and the models in eval mode (``model.eval()`` without ``torch.no_grad()``): no
    #: optimizer step in it nor after it, no backward in a step the instruments timed
    #: (``open_steps.EpochWork``); an evaluation's batches, as those flagged
    #: ``FLAG_EVALUATING`` when written are; and a look at one batch before the run's first
    #: optimizer step, no backward nor update in it (``model(next(iter(loader)))``)
    evaluation_rows: list[tuple[int, int]] = field(default_factory=list)
    #: the first row of each of its epochs left before they were exhausted where it fetches a
    #: batch ahead (accelerate's prepared loader): a row that only fetched, no step
    #: (``open_steps.FETCHES_AHEAD_DRIVERS``)
    ahead_rows: list[int] = field(default_factory=list)
    #: time away from training while this loader was iterated (not a training loader): from the
    #: first fetch of each run of its fetches to the next fetch of another loader or the next
    #: optimizer step, ns; and the part of it, and of its fetches, before the run's first
    #: optimizer step (a trainer's sanity check of its validation loader)
    phase_ns: int = 0
    phase_before_training_ns: int = 0
    fetches_before_training: int = 0
    #: where its fetches come from: "transformers", "lightning", "accelerate", "keras-fit",
    #: "skorch" (their trainers and wrappers iterate the loader), "fastai" (a fastai DataLoader, whatever
    #: iterates it), "keras" and "keras-pydataset" (a loader Keras made of the arrays, or of
    #: the PyDataset or generator, given to ``model.fit``), "skorch-arrays" (a loader skorch
    #: made of the arrays given to ``fit``), or None (the user's own loop)
    driver: str | None = None
    #: its samples are tensors already in memory: a ``TensorDataset``, or a ``Subset`` or
    #: ``ConcatDataset`` of them (``random_split``'s), :data:`~.instrument.loader.IN_MEMORY_DATASETS`
    in_memory: bool = False
    #: :attr:`fetches_ahead` as the segmenter decided it once the first steps told, kept from
    #: then on (None: not decided yet). A batch the loop skips later (``continue``) is a row
    #: that only fetched, as a batch fetched ahead is; read so, it turned the run's steps into
    #: its optimizer rows, which are not written once the loader's own rows were decided on:
    #: 144 steps read as 1
    ahead_decided: bool | None = None
    #: the slot of the loader whose epochs this one goes on from: built anew (a new DataLoader
    #: for each epoch) over the same dataset, iterated the same way (autograd on or off; as a
    #: training loader's, the models in eval mode or not), its first fetch came once that
    #: loader's step was closed or left after two batches or more of its epoch; None where it
    #: is no such loader
    follows: int | None = None

    def over_same_dataset(self, other: LoaderInfo) -> bool:
        """Its dataset is ``other``'s: the same object, or one of the same type and length (a
        ``TensorDataset`` built anew over the same tensors for each epoch)."""
        if self.dataset_id and self.dataset_id == other.dataset_id:
            return True
        return self.dataset_len is not None and (self.dataset_type, self.dataset_len) == (
            other.dataset_type,
            other.dataset_len,
        )

    @property
    def fetches_ahead(self) -> bool | None:
        """The loop fetches this loader's next batches before it trains on the current one
        (a trainer's prefetch of one batch: the first step of each epoch holds two fetches and
        no optimizer step; or of a whole gradient-accumulation cycle: ``fetch_only_rows``):
        True, False, or None while too few steps tell (or, not yet known to fetch ahead,
        while a row without an optimizer step waits to be told apart); once decided
        (:attr:`ahead_decided`), that."""
        if self.ahead_decided is not None:
            return self.ahead_decided
        ahead = self.epoch_first_rows_without_step or self.fetch_only_rows
        if self.rows_without_step:
            return False
        if ahead and self.rows_with_step >= 2:
            return True
        if self.rows_with_step and not ahead and not self.rows_untold:
            return False
        return None

    @property
    def is_training(self) -> bool:
        """A loader is a training loader when optimizer steps follow its batches."""
        return self.optimizer_steps > 0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class RunRecord:
    """Everything measured in one run; the input of the analysis and the views.

    The instruments and samplers write it while the run goes on; readers take a
    :meth:`snapshot`.
    """

    steps: StepTable = field(default_factory=StepTable)
    host: SampleTable | None = None
    gpus: dict[int, SampleTable] = field(default_factory=dict)  #: keyed by CUDA device index
    loaders: list[LoaderInfo] = field(default_factory=list)
    optimizer_steps: int = 0
    markers: int = 0
    first_fetch_wait_ns: dict[int, int] = field(default_factory=dict)  #: by loader slot
    t0_ns: int = 0  #: ``perf_counter_ns`` at the run start
    t0_wall: float = 0.0  #: ``time.time()`` at the run start
    elapsed_ns: int = 0  #: run duration, set when the run ends (live: 0)
    #: what ``torch.profiler`` captured (``--profile``), set as the run ends; None: not asked
    profile: ProfileCapture | None = None
    #: the FLOPs of one counted step (``instrument.flop_count``), set as the run ends
    flops: FlopCount | None = None
    #: the optimizers that stepped, in the order of their first step
    optimizers: list[OptimizerInfo] = field(default_factory=list)
    #: ``(outer, inner)`` phase names of each phase that started inside another and was timed
    #: as part of it (an optimizer's closure: ``("optimizer", "forward")``), set as the run ends
    phases_inside: tuple[tuple[str, str], ...] = ()

    @property
    def nbytes(self) -> int:
        """Memory held by the tables, in bytes."""
        total = self.steps.nbytes
        if self.host is not None:
            total += self.host.nbytes
        return total + sum(t.nbytes for t in self.gpus.values())

    def snapshot(self, start_row: int = 0, *, samples: bool = True) -> RecordSnapshot:
        """A copy of the record as it is now: step rows from ``start_row`` on, the loaders, the
        counters and (unless ``samples`` is False) every sample table. The step rows and the
        loaders agree when their writer is paused (``Run.snapshot`` takes care of that while
        the run goes on)."""
        elapsed = self.elapsed_ns
        if not elapsed and self.t0_ns:
            elapsed = time.perf_counter_ns() - self.t0_ns
        return RecordSnapshot(
            steps=self.steps.snapshot(start_row),
            loaders=tuple(replace(info) for info in self.loaders),
            optimizer_steps=self.optimizer_steps,
            markers=self.markers,
            first_fetch_wait_ns=dict(self.first_fetch_wait_ns),
            host=self.host.snapshot() if samples and self.host is not None else None,
            gpus={i: table.snapshot() for i, table in self.gpus.items()} if samples else {},
            elapsed_ns=elapsed,
            ended=bool(self.elapsed_ns),
            profile=self.profile,
            flops=self.flops,
            optimizers=tuple(self.optimizers),
            phases_inside=self.phases_inside,
        )


@dataclass(frozen=True)
class RecordSnapshot:
    """An immutable copy of a :class:`RunRecord` (see there); sample tables as their columns."""

    steps: StepColumns
    loaders: tuple[LoaderInfo, ...]
    optimizer_steps: int
    markers: int
    first_fetch_wait_ns: dict[int, int]
    #: the host table's columns, ``t`` in seconds since the start (None: no host samples, or
    #: not copied)
    host: dict[str, array] | None
    gpus: dict[int, dict[str, array]]  #: each GPU table's columns, by CUDA device index
    elapsed_ns: int  #: the run's duration, or the time since its start while it runs
    ended: bool  #: the run had ended when the copy was taken
    profile: ProfileCapture | None = None  #: see ``RunRecord.profile`` (not a copy: final)
    flops: FlopCount | None = None  #: see ``RunRecord.flops``
    optimizers: tuple[OptimizerInfo, ...] = ()  #: see ``RunRecord.optimizers``
    phases_inside: tuple[tuple[str, str], ...] = ()  #: see ``RunRecord.phases_inside``
